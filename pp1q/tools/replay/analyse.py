"""Protocol-analyser text: one line per message, optional per-row detail lines.

    time(s)    conn dir  TYPE          key fields
    0.000100   c1   V>W  STEP          s0 g1 r1 last_committed=2 depth=5 T=1 dense seed=7
    0.000200   c1   W>V  REPLY         s0 g1 r1 #1 pos=3 token=17 dense n=64
                          row: support=40 token=17 q=123456/2^24 (0.00736) checksum=ok valid
    0.000280   c1   W>V  PROPOSAL      s1 g1 r1 pos=3..7 tokens=16,57,29,29,29 entries=6,6,6,...
                          row #1 pos=3: support=6 token=16 q=11353264/2^24 (0.676707) ...

A PROPOSAL (revision 3) gets a detail line per position, as its REPLY would (``row #i
pos=P:``, then what ``row:`` says of a REPLY); its row checksum is compared with the row.

Rows are checked here only to describe them (support size, q of the sampled id, the
frame checksum, the row validator's verdict); ``pp1q replay --verify`` is what replays
them through a verifier endpoint.
"""

from __future__ import annotations

import numpy as np

from pp1q.core.errors import RemoteProtocolError
from pp1q.core.q import MASS, parse_sparse, validate_dense
from pp1q.tools.replay.streams import Item
from pp1q.wire import (
    Commit,
    Completion,
    Context,
    Form,
    Hello,
    HelloAnswer,
    Proposal,
    Refusal,
    Reply,
    Reset,
    Status,
    Step,
)
from pp1q.wire.events import (
    Discarded,
    ProposalFailed,
    ProposalReady,
    SessionRefused,
    SessionStarted,
)
from pp1q.wire.proposal import row_checksum

TYPE_WIDTH = 13  # longest type name (HELLO_ANSWER) plus a space


def _key(m) -> str:
    return f"s{m.slot} g{m.generation} r{m.round_id}"


def _limits(lim) -> str:
    return (f"slots={lim.max_slots} depth={lim.max_depth} support={lim.max_support} "
            f"context={lim.max_context}")


def _step_form(m: Step) -> str:
    if m.temperature == 0:
        return "greedy"
    return "dense" if m.top_k == 0 else f"top_k={m.top_k}"


def _hello(m: Hello) -> str:
    return (f"session={m.session:016x} versions={','.join(map(str, m.versions))} "
            f"rev={m.revision} "
            f"vocab={m.identity.vocab} {_limits(m.limits)} target={m.identity.target_id}")


def _reply(m: Reply) -> str:
    return (f"{_key(m)} #{m.index} pos={m.position} token={m.token} "
            f"{Form(m.form).name.lower()} n={m.entries}")


def _proposal(m: Proposal) -> str:
    n = len(m.tokens)
    last = m.first_position + n - 1
    return (f"{_key(m)} pos={m.first_position}..{last} "
            f"tokens={','.join(map(str, m.tokens))} entries={','.join(map(str, m.entries))}")


def _completion(m: Completion) -> str:
    status = "ok" if m.status == Status.OK else f"aborted({m.reason})"
    return f"{_key(m)} rows={m.rows} bytes={m.reply_bytes} status={status}"


DESCRIBE = {  # message class -> (type label, key fields)
    Hello: ("HELLO", _hello),
    HelloAnswer: ("HELLO_ANSWER", lambda m: f"session={m.session:016x} v{m.version} "
                                            f"{_limits(m.limits)}"),
    Step: ("STEP", lambda m: f"{_key(m)} last_committed={m.last_committed} depth={m.depth} "
                             f"T={m.temperature:g} {_step_form(m)} seed={m.seed}"),
    Reply: ("REPLY", _reply),
    Completion: ("COMPLETION", _completion),
    Proposal: ("PROPOSAL", _proposal),
    Commit: ("COMMIT", lambda m: f"{_key(m)} accepted={m.accepted} token={m.token} "
                                 f"committed={m.committed}"),
    Reset: ("RESET", lambda m: f"s{m.slot} g{m.generation} reason={m.reason}"),
    Refusal: ("REFUSAL", lambda m: f"{_key(m)} reason={m.reason} {m.detail!r}"),
    Context: ("CONTEXT", lambda m: f"s{m.slot} g{m.generation} start={m.start} "
                                   f"tokens={m.count} digest={m.digest:016x}"),
}


class Analyser:
    """Formats decoded items; remembers each connection's vocabulary (from HELLO)."""

    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose
        self.t0: int | None = None
        self._vocab: dict[int, int] = {}
        self._sampled: dict[tuple[int, int, int, int], bool] = {}  # step key -> sampled

    def lines(self, item: Item) -> list[str]:
        if self.t0 is None:
            self.t0 = item.time_ns
        head = f"{(item.time_ns - self.t0) / 1e9:11.6f}  c{item.conn:<3} "
        if item.what in ("open", "close", "info"):
            fields = " ".join(f"{k}={v}" for k, v in sorted(item.meta.items()))
            return [f"{head}{'--':4} {item.what.upper():<{TYPE_WIDTH}} {fields}".rstrip()]
        flow = str(item.flow)
        if item.what == "error":
            e = item.error
            return [f"{head}{flow:4} {'!! ERROR':<{TYPE_WIDTH}} {e.reason.value}: {e.detail} "
                    "(stream unusable from here)"]
        if item.what == "bytes":
            return [f"{head}{flow:4} {'BYTES':<{TYPE_WIDTH}} {item.nbytes} bytes not decoded"]
        m = item.message
        if isinstance(m, Hello):
            self._vocab[item.conn] = m.identity.vocab
        elif isinstance(m, Step):
            self._sampled[(item.conn, m.slot, m.generation, m.round_id)] = m.temperature != 0
        label, describe = DESCRIBE[type(m)]
        line = f"{head}{flow:4} {label:<{TYPE_WIDTH}} {describe(m)}"
        if item.frame is not None and item.frame.error is not None:
            line += f"  [{item.frame.error.reason.value}]"
        out = [line]
        pad = " " * len(head) + "     "
        if self.verbose and isinstance(m, Reply):
            out.append(pad + "row: " + self.row(item))
        elif self.verbose and isinstance(m, Proposal):
            out += [pad + line for line in self.proposal_rows(item)]
        return out

    def row(self, item: Item) -> str:
        """support size, sampled id, q of the sampled id, checksum, validator verdict."""
        m: Reply = item.message
        checksum = _frame_checksum(item)
        if m.form == Form.TOKEN_ONLY:
            if self._sampled.get((item.conn, m.slot, m.generation, m.round_id)):
                return f"token={m.token} checksum={checksum} INVALID (missing_q: sampled step)"
            return f"no q (greedy) token={m.token} checksum={checksum}"
        if m.q is None:
            return f"token={m.token} checksum={checksum}, payload dropped"
        return self._row_text(item.conn, m.form, m.token, m.ids, m.q, checksum)

    def proposal_rows(self, item: Item) -> list[str]:
        """A PROPOSAL's positions, each as ``row`` describes a REPLY; its row checksum is
        checked against the row (the frame's own checksum covers the whole payload)."""
        m: Proposal = item.message
        checksum = _frame_checksum(item)
        if m.ids is None or m.q is None:
            return [f"rows: checksum={checksum}, payload dropped"]
        out = []
        for i, (token, ids, q, declared) in enumerate(
                zip(m.tokens, m.ids, m.q, m.row_checksums, strict=True), start=1):
            ok = checksum == "ok" and row_checksum(ids, q) == declared
            out.append(f"row #{i} pos={m.first_position + i - 1}: " + self._row_text(
                item.conn, Form.SPARSE, token, ids, q, "ok" if ok else "BAD (row checksum)"))
        return out

    def _row_text(self, conn: int, form: int, token: int, ids, q, checksum: str) -> str:
        q = np.asarray(q)
        if form == Form.DENSE:
            support = int(np.count_nonzero(q))
            q_tok = float(q[token]) if 0 <= token < q.size else 0.0
        else:
            ids = np.asarray(ids)
            support = int(ids.size)
            hit = np.flatnonzero(ids == token)
            q_tok = float(q[hit[0]]) if hit.size else 0.0
        return (f"support={support} token={token} q={q_tok * MASS:.0f}/2^24 ({q_tok:.6g}) "
                f"checksum={checksum} {self._verdict(conn, form, token, ids, q)}")

    def _verdict(self, conn: int, form: int, token: int, ids, q) -> str:
        vocab = self._vocab.get(conn)
        if vocab is None:
            return "validity unknown (no HELLO)"
        try:
            if form == Form.DENSE:
                q = validate_dense(q, vocab)
                if not q[token] > 0:
                    return "INVALID (zero_q_at_token)"
            else:
                parse_sparse(ids, q, vocab).require_token(token)
        except RemoteProtocolError as e:
            return f"INVALID ({e.reason.value})"
        return "valid"


def _frame_checksum(item: Item) -> str:
    err = item.frame.error if item.frame is not None else None
    return "ok" if err is None else f"BAD ({err.reason.value})"


def describe_event(ev) -> str:
    """One line for an endpoint event of the verifier replay."""
    if isinstance(ev, ProposalReady):
        kind = "greedy" if ev.greedy else f"{len(ev.q_rows)} q rows"
        return (f"PROPOSAL_READY  s{ev.slot} g{ev.generation} r{ev.round_id} "
                f"drafts={list(ev.draft_ids)} ({kind})")
    if isinstance(ev, ProposalFailed):
        return (f"PROPOSAL_FAILED s{ev.slot} g{ev.generation} r{ev.round_id} "
                f"reason={ev.reason.value} {ev.detail!r}")
    if isinstance(ev, Discarded):
        return (f"DISCARDED       s{ev.slot} g{ev.generation} r{ev.round_id} "
                f"{ev.msg_type.name} reason={ev.reason.value} bytes={ev.nbytes}")
    if isinstance(ev, SessionStarted):
        return f"SESSION_STARTED session={ev.session:016x} v{ev.version}"
    if isinstance(ev, SessionRefused):
        who = "peer" if ev.by_peer else "us"
        return f"SESSION_REFUSED by {who} reason={ev.reason.value} {ev.detail!r}"
    return repr(ev)
