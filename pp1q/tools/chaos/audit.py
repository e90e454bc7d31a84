"""What the proxy saw delivered, checked against what the verifier committed.

The proxy sits on the wire, so it can prove two promises without trusting either
daemon's own counters:

- zero partial commits: every COMMIT (verifier -> worker) names a proposal whose rows
  1..depth reached the verifier exactly once each, in order and byte-identical to what
  the worker sent, with its totals intact, and no frame of which took a poisoning
  fault; ``committed`` = last_committed + accepted + 1. The rows come as REPLY frames
  followed by a COMPLETION (the totals), or all at once in one PROPOSAL (revision 3: a
  sparse step; the frame carries every position and plays the COMPLETION).
- zero sampled ids without q: every row of a committed sampled proposal (STEP
  temperature > 0) carried a q row (dense or sparse) with q(token) > 0; and a proposal
  that came as a PROPOSAL answered a sampled sparse step (the only kind it may answer).

A PROPOSAL for a step whose proposal is already complete is not recorded: the verifier
discards it unread (``duplicate_round``), so it neither adds rows nor needs to be intact.
Anything else is appended to ``violations``. State is dropped per slot at RESET and
per connection at close, so a long soak keeps it bounded.
"""

from __future__ import annotations

import threading

import numpy as np

from pp1q.tools.chaos.frames import Piece
from pp1q.wire import Form, MsgType

Key = tuple[int, int, int, int]  # connection, slot, generation, round


def q_at_token(piece: Piece, reply) -> float:
    """q(token) read from a REPLY payload (0.0 when absent or unreadable)."""
    payload, token, n = piece.payload, reply.token, reply.entries
    if reply.form == Form.DENSE and 0 <= token < n and len(payload) == 4 * n:
        return float(np.frombuffer(payload, "<f4", 1, 4 * token)[0])
    if reply.form == Form.SPARSE and len(payload) == 8 * n:
        ids = np.frombuffer(payload, "<i4", n)
        at = np.flatnonzero(ids == token)
        if at.size == 1:
            return float(np.frombuffer(payload, "<f4", n, 4 * n)[at[0]])
    return 0.0


def proposal_rows(piece: Piece, prop) -> list[tuple[int, float]]:
    """(index, q(token)) of every position of a PROPOSAL, its rows read from the payload
    as ``entries`` says (q 0.0 for every position when the payload does not have exactly
    those rows: a cut or padded frame)."""
    n = sum(prop.entries)
    if len(piece.payload) != 8 * n or len(prop.tokens) != len(prop.entries):
        return [(i, 0.0) for i in range(1, len(prop.tokens) + 1)]
    words = np.frombuffer(piece.payload, "<i4", 2 * n)
    out, at = [], 0
    for i, (token, k) in enumerate(zip(prop.tokens, prop.entries, strict=True), 1):
        ids = words[at:at + k]
        hit = np.flatnonzero(ids == token)
        q = float(words[at + k:at + 2 * k].view("<f4")[hit[0]]) if hit.size == 1 else 0.0
        out.append((i, q))
        at += 2 * k
    return out


class WireAudit:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: dict[Key, object] = {}
        self._rows: dict[Key, list[tuple[int, bool, float]]] = {}  # index, intact, q(token)
        self._completed: set[Key] = set()
        self._by_proposal: set[Key] = set()  # steps answered (in part) by a PROPOSAL
        self._sparse_rows: set[Key] = set()  # steps a sparse REPLY row answered
        self._poisoned: set[Key] = set()
        self.violations: list[str] = []
        self.commits = 0  # proposals committed
        self.proposal_commits = 0  # of them, proposals that came as one PROPOSAL frame
        self.streamed_sparse_commits = 0  # ...and sparse ones that came as REPLY rows
        self.committed_drafts = 0  # draft tokens accepted in them
        self.sampled_rows = 0  # rows of committed sampled proposals, each checked for q

    def poison(self, conn: int, message) -> None:
        with self._lock:
            self._poisoned.add(_key(conn, message))

    def delivered(self, conn: int, to_worker: bool, piece: Piece, message, intact: bool) -> None:
        """One frame written to its receiver; ``message`` is its decoded control part."""
        if message is None:
            return
        with self._lock:
            t = piece.mtype
            if to_worker and t == MsgType.STEP:
                self._steps[_key(conn, message)] = message
            elif to_worker and t == MsgType.COMMIT:
                self._check_commit(_key(conn, message), message)
            elif to_worker and t == MsgType.RESET:
                self._forget(lambda k: k[:2] == (conn, message.slot)
                             and k[2] <= message.generation)
            elif not to_worker and t == MsgType.REPLY:
                q = q_at_token(piece, message) if message.form != Form.TOKEN_ONLY else 0.0
                key = _key(conn, message)
                self._rows.setdefault(key, []).append((message.index, intact, q))
                if message.form == Form.SPARSE:
                    self._sparse_rows.add(key)
            elif not to_worker and t == MsgType.COMPLETION and intact:
                self._completed.add(_key(conn, message))
            elif not to_worker and t == MsgType.PROPOSAL:
                self._proposal(_key(conn, message), piece, message, intact)

    def _proposal(self, key: Key, piece: Piece, prop, intact: bool) -> None:
        if key in self._completed:
            return  # a copy of a complete proposal: the verifier discards it (duplicate_round)
        self._rows.setdefault(key, []).extend(
            (i, intact, q) for i, q in proposal_rows(piece, prop))
        self._by_proposal.add(key)
        if intact:
            self._completed.add(key)

    def connection_closed(self, conn: int) -> None:
        with self._lock:
            self._forget(lambda k: k[0] == conn)

    def _check_commit(self, key: Key, commit) -> None:
        step = self._steps.get(key)
        rows = self._rows.get(key, [])
        where = f"COMMIT slot {key[1]} gen {key[2]} round {key[3]}"
        self.commits += 1
        self.committed_drafts += commit.accepted
        if step is None:
            self.violations.append(f"{where}: no STEP seen")
            return
        want = list(range(1, step.depth + 1))
        if key in self._poisoned:
            self.violations.append(f"{where}: a frame of this proposal was faulted")
        if [i for i, _, _ in rows] != want or not all(ok for _, ok, _ in rows):
            self.violations.append(f"{where}: rows delivered {[(i, ok) for i, ok, _ in rows]}")
        if key not in self._completed:
            self.violations.append(f"{where}: no intact COMPLETION or PROPOSAL delivered")
        if key in self._sparse_rows and key not in self._by_proposal:
            self.streamed_sparse_commits += 1
        if key in self._by_proposal:
            self.proposal_commits += 1
            if not (step.temperature > 0 and step.top_k > 0):  # validate.check_proposal
                self.violations.append(f"{where}: a PROPOSAL answered a dense or greedy step")
        if not 0 <= commit.accepted <= step.depth or \
                commit.committed != step.last_committed + commit.accepted + 1:
            self.violations.append(f"{where}: accepted {commit.accepted}, committed "
                                   f"{commit.committed}, last_committed {step.last_committed}")
        if step.temperature > 0 or step.top_k > 0:
            self.sampled_rows += len(rows)
            missing = [i for i, _, q in rows if not q > 0.0]
            if missing:
                self.violations.append(f"{where}: rows {missing} without q(token) > 0")
        self._forget(lambda k: k == key)

    def _forget(self, gone) -> None:
        for d in (self._steps, self._rows):
            for k in [k for k in d if gone(k)]:
                del d[k]
        self._completed = {k for k in self._completed if not gone(k)}
        self._by_proposal = {k for k in self._by_proposal if not gone(k)}
        self._sparse_rows = {k for k in self._sparse_rows if not gone(k)}
        self._poisoned = {k for k in self._poisoned if not gone(k)}

    def pending(self) -> int:
        """Proposals still tracked (bounded: the soak checks it stays small)."""
        with self._lock:
            return len(self._steps)


def _key(conn: int, message) -> Key:
    return conn, message.slot, message.generation, getattr(message, "round_id", 0)
