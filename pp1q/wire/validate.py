"""Strict validators for decoded messages, each failure a closed-set ``Reason``.

The same checks serve both directions: a peer's message fails with
``RemoteProtocolError``, our own (about to be sent) with ``LocalProtocolError``;
callers pass the class as ``err``. Row checks call pp1q.core.q's parsers, which raise
``RowValidationError`` (a ``RemoteProtocolError``); nothing here renormalises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from pp1q.core.errors import Reason, RemoteProtocolError, RowValidationError
from pp1q.core.q import (
    DyadicRow,
    dense_row_of_valid,
    parse_sparse,
    parse_sparse_rows,
    validate_dense,
)
from pp1q.wire.limits import Limits
from pp1q.wire.messages import (
    KNOWN_VERSIONS,
    WIRE_REVISION,
    WIRE_V1,
    WIRE_V2,
    Commit,
    Completion,
    Context,
    Form,
    Hello,
    Identity,
    Proposal,
    Reply,
    Status,
    Step,
)
from pp1q.wire.proposal import row_checksum


def choose_version(offered, ours) -> int:
    """Highest version both sides enabled. Sampled speculation (v2) runs only if both
    configured it: v2 offered to a side that did not enable it is refused, never quietly
    downgraded to v1 (the design: no auto-upgrade, and no silent mode change either)."""
    offered, ours = set(offered), set(ours)
    if not ours or (WIRE_V2 in offered and WIRE_V2 not in ours):
        raise RemoteProtocolError(
            Reason.SPECULATION_NOT_ENABLED,
            "sampled speculation (wire v2) is not enabled here" if ours
            else "speculation is off here")
    common = offered & ours & set(KNOWN_VERSIONS)
    if not common:
        raise RemoteProtocolError(
            Reason.BAD_VERSION, f"no common wire version: offered {sorted(offered)}"
        )
    return max(common)


def check_revision(revision: int, err: type = RemoteProtocolError) -> None:
    """Both ends speak the same revision of wire v2 (revision 1 had no CONTEXT message
    and sent the request context on a second connection: nothing of it is read here)."""
    if revision != WIRE_REVISION:
        raise err(Reason.BAD_REVISION,
                  f"peer speaks wire v2 revision {revision}; this end speaks {WIRE_REVISION}")


def check_identity(ours: Identity, theirs: Identity, err: type = RemoteProtocolError) -> None:
    """Every identity field must match exactly (no partial compatibility)."""
    wrong = [f for f in Identity.__struct_fields__ if getattr(ours, f) != getattr(theirs, f)]
    if wrong:
        raise err(Reason.WRONG_IDENTITY, "mismatched " + ", ".join(wrong))


def identity_differences(ours: Identity, theirs: Identity) -> str:
    """Each field that differs, with both values: for the log of the end that compared
    them (a REFUSAL's detail names the fields only: MAX_DETAIL_CHARS is too short for
    two model identities, and an operator needs both to see which end to change)."""
    return "; ".join(f"{f}: here {getattr(ours, f)!r}, the peer's {getattr(theirs, f)!r}"
                     for f in Identity.__struct_fields__
                     if getattr(ours, f) != getattr(theirs, f))


def identity_named(ours: Identity, detail: str) -> str:
    """This end's values of the fields a peer's refusal named ("mismatched a, b")."""
    named = set(re.findall(r"\w+", detail))
    return "; ".join(f"{f}: here {getattr(ours, f)!r}"
                     for f in Identity.__struct_fields__ if f in named)


def check_answer_limits(offered: Limits, answered: Limits, vocab: int) -> None:
    """The negotiated limits may only shrink what we offered."""
    answered.check(vocab)
    for f in Limits.__struct_fields__:
        if f == "dense_len" or f == "dense_row_bytes":
            ok = getattr(answered, f) == getattr(offered, f)
        else:
            ok = getattr(answered, f) <= getattr(offered, f)
        if not ok:
            raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, f"answered {f} exceeds our offer")


def negotiate(hello: Hello, versions: Sequence[int], identity: Identity,
              limits: Limits) -> tuple[int, Limits]:
    """The worker's checks of a HELLO against its own configuration, and what they
    settle: the version both enabled and the limits both honour (each the minimum)."""
    check_revision(hello.revision)  # first: a revision-1 HELLO's limits lack fields
    version = choose_version(hello.versions, versions)
    check_identity(identity, hello.identity)
    hello.limits.check(hello.identity.vocab)
    return version, limits.meet(hello.limits)


def check_context(ctx: Context, limits: Limits, vocab: int, err: type = RemoteProtocolError
                  ) -> np.ndarray:
    """A CONTEXT's sizes and ids (the receiver's decoder checked the sizes already,
    before buffering; this is the sender's check and the receiver's id check). Returns
    the ids; nothing of them is stored before every one passed."""
    if ctx.slot >= limits.max_slots:
        raise err(Reason.SLOT_OUT_OF_RANGE, f"context slot {ctx.slot} >= {limits.max_slots}")
    if ctx.count == 0:
        raise err(Reason.UNEXPECTED_SIZE, "context without tokens")
    if ctx.start + ctx.count > limits.max_context:
        raise err(Reason.CONTEXT_TOO_LONG,
                  f"context of {ctx.start + ctx.count} tokens > {limits.max_context}")
    ids = np.asarray(ctx.tokens)
    if ids.ndim != 1 or ids.size != ctx.count:
        raise err(Reason.UNEXPECTED_SIZE, f"{ids.size} context ids for count {ctx.count}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise err(Reason.ID_OUT_OF_RANGE, f"context id outside [0, {vocab})")
    return ids


# enum members as plain names where every row reads them: Python 3.11 takes ~0.1 us to
# look up an enum member
_TOKEN_ONLY, _DENSE, _SPARSE = Form.TOKEN_ONLY, Form.DENSE, Form.SPARSE


def step_form(step: Step) -> Form:
    """The q representation a step's replies must carry."""
    if step.temperature == 0:
        return _TOKEN_ONLY
    return _DENSE if step.top_k == 0 else _SPARSE


def check_step(step: Step, version: int, limits: Limits, err: type = RemoteProtocolError) -> None:
    """Static checks of a STEP against the session (state checks live in the endpoints)."""
    if step.slot >= limits.max_slots:
        raise err(Reason.SLOT_OUT_OF_RANGE, f"slot {step.slot} >= {limits.max_slots}")
    if not 0 < step.depth <= limits.max_depth:
        raise err(Reason.DEPTH_TOO_LARGE, f"depth {step.depth} not in 1..{limits.max_depth}")
    if step.first_position != step.last_committed + 1:
        raise err(Reason.BAD_POSITION,
                  f"first_position {step.first_position} != last_committed + 1")
    if step.first_position + step.depth > 0xFFFFFFFF:
        raise err(Reason.BAD_POSITION, "positions overflow 32 bits")
    t = step.temperature
    if not (math.isfinite(t) and t >= 0):
        raise err(Reason.BAD_TEMPERATURE, f"temperature {t!r}")
    if version == WIRE_V1 and (t != 0 or step.top_k != 0):
        raise err(Reason.SAMPLED_ON_V1, "a v1 session carries greedy steps only")
    if t == 0 and step.top_k != 0:
        raise err(Reason.BAD_TOP_K, "greedy step with a top-k support policy")
    if step.top_k > limits.max_support:
        raise err(Reason.SUPPORT_TOO_LARGE, f"top_k {step.top_k} > {limits.max_support}")


def check_reply(
    reply: Reply, step: Step, vocab: int, err: type = RemoteProtocolError,
    q_checked: bool = False,
) -> DyadicRow | None:
    """One REPLY of ``step`` (already matched on slot/generation/round/index).

    Returns the validated sparse ``DyadicRow``; None for a dense row (validated in
    place, see ``Rows``) and for a token-only reply of a greedy step. ``q_checked``:
    the decoder checked a dense q while copying it in (``Frame.q_checked``).
    """
    position = step.first_position + reply.index - 1
    if reply.position != position:
        raise err(Reason.BAD_POSITION, f"reply position {reply.position} != {position}")
    if not 0 <= reply.token < vocab:
        raise err(Reason.ID_OUT_OF_RANGE, f"token {reply.token} outside [0, {vocab})")
    want = step_form(step)
    if reply.form != want:  # compared as ints: no Form() lookup per row
        got = Form(reply.form)
        if want is not _TOKEN_ONLY and got is _TOKEN_ONLY:
            raise err(Reason.MISSING_Q, "sampled step answered without q")
        raise err(Reason.UNEXPECTED_SIZE, f"{got.name} reply for a {want.name} step")
    if want is _TOKEN_ONLY:
        return None
    if reply.q is None:
        raise err(Reason.MISSING_Q, "reply without q values")
    if want is _DENSE:  # validated in place; its DyadicRow reads it there (Rows)
        q = validate_dense(reply.q, vocab, q_checked)
        if not (reply.token < q.size and q[reply.token] > 0):  # never an IndexError
            raise RowValidationError(Reason.ZERO_Q_AT_TOKEN, f"q({reply.token}) = 0")
        return None
    if reply.entries > step.top_k:
        raise err(Reason.SUPPORT_TOO_LARGE, f"{reply.entries} entries > top_k {step.top_k}")
    return parse_sparse(reply.ids, reply.q, vocab, reply.token)  # and q(token) > 0


def check_proposal(prop: Proposal, step: Step, vocab: int, err: type = RemoteProtocolError,
                   words=None) -> list[DyadicRow]:
    """A PROPOSAL of ``step`` (already matched on slot/generation/round; its sizes were
    checked against the limits by the decoder): the completion's matches, then every
    position as ``check_reply`` checks a sparse REPLY, its row checksum included.
    ``words``: the payload its rows view, as int32 (``Frame.words``; None: built from
    the rows). Returns the validated rows, in order."""
    if prop.first_position != step.first_position:
        raise err(Reason.BAD_POSITION, "proposal first_position differs")
    if prop.context_version != step.context_version:
        raise err(Reason.WRONG_IDENTITY, "proposal context_version differs")
    want = step_form(step)
    if want is not _SPARSE:
        raise err(Reason.UNEXPECTED_SIZE, f"PROPOSAL for a {want.name} step")
    if len(prop.tokens) != step.depth:
        raise err(Reason.UNEXPECTED_SIZE, f"{len(prop.tokens)} positions, depth {step.depth}")
    if prop.ids is None or prop.q is None:
        raise err(Reason.MISSING_Q, "proposal without rows")
    for i, (token, n, ids, q, declared) in enumerate(zip(
            prop.tokens, prop.entries, prop.ids, prop.q, prop.row_checksums, strict=True), 1):
        if not 0 <= token < vocab:
            raise err(Reason.ID_OUT_OF_RANGE, f"token {token} outside [0, {vocab})")
        if n > step.top_k:
            raise err(Reason.SUPPORT_TOO_LARGE, f"{n} entries > top_k {step.top_k}")
        if row_checksum(ids, q) != declared:
            raise err(Reason.CHECKSUM_MISMATCH, f"row {i} checksum")
    if words is None:  # not decoded (our own, say): its payload as it would leave
        words = np.frombuffer(b"".join(prop.payload_parts()), np.int32)
    return parse_sparse_rows(words, prop.entries, prop.tokens, vocab)  # q(token) > 0 too


class Rows(Sequence):
    """The q rows of a validated proposal. Sparse rows are parsed during validation;
    a dense row (already fully validated in place) becomes a ``DyadicRow`` reading its
    FP32 q in place on first access (its support is extracted only if read)."""

    def __init__(self, replies, rows, vocab: int) -> None:
        self._replies, self._rows, self._vocab = replies, list(rows), vocab

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        row = self._rows[i]
        if row is None:
            # validated in check_reply, in a read-only buffer: read in place, not re-checked
            row = self._rows[i] = dense_row_of_valid(self._replies[i].q, self._vocab)
        return row

    def __iter__(self):
        # Sequence's own __iter__ calls __getitem__ until IndexError: ~1 us a row, and the
        # decider walks a round's 20 rows several times
        for i, row in enumerate(self._rows):
            yield row if row is not None else self[i]

    def __repr__(self) -> str:
        return f"Rows({len(self)} rows)"


def check_completion(
    c: Completion, step: Step, rows: int, reply_bytes: int, reply_checksum: int
) -> None:
    """COMPLETION of an OK step must match every total the receiver counted itself."""
    if c.first_position != step.first_position:
        raise RemoteProtocolError(Reason.BAD_POSITION, "completion first_position differs")
    if c.context_version != step.context_version:
        raise RemoteProtocolError(Reason.WRONG_IDENTITY, "completion context_version differs")
    if c.status != Status.OK:
        raise RemoteProtocolError(Reason.WORKER_ABORTED, f"worker aborted: {c.reason}")
    if c.reason:
        raise RemoteProtocolError(Reason.MALFORMED_CONTROL, "OK completion with a reason")
    if c.rows != step.depth or rows != step.depth:
        raise RemoteProtocolError(
            Reason.UNEXPECTED_SIZE, f"{rows} rows received, {c.rows} declared, depth {step.depth}"
        )
    if c.reply_bytes != reply_bytes:
        raise RemoteProtocolError(
            Reason.UNEXPECTED_SIZE, f"reply bytes {reply_bytes} != declared {c.reply_bytes}"
        )
    if c.reply_checksum != reply_checksum:
        raise RemoteProtocolError(Reason.CHECKSUM_MISMATCH, "completion reply checksum")


def check_abort_reason(c: Completion) -> None:
    """An ABORTED completion names its cause from the closed set; nothing else is legal."""
    if c.status not in (Status.OK, Status.ABORTED):
        raise RemoteProtocolError(Reason.MALFORMED_CONTROL, f"completion status {c.status}")
    if c.status == Status.ABORTED and c.reason not in Reason._value2member_map_:
        raise RemoteProtocolError(Reason.MALFORMED_CONTROL, "abort reason outside the enum")


def check_commit(commit: Commit, step: Step, vocab: int, err: type = RemoteProtocolError) -> None:
    if commit.accepted > step.depth:
        raise err(Reason.DEPTH_TOO_LARGE, f"accepted {commit.accepted} > depth {step.depth}")
    if commit.committed != step.last_committed + commit.accepted + 1:
        raise err(Reason.BAD_POSITION, f"committed {commit.committed} != last_committed+accepted+1")
    if not 0 <= commit.token < vocab:
        raise err(Reason.ID_OUT_OF_RANGE, f"token {commit.token} outside [0, {vocab})")


__all__ = [
    "check_abort_reason", "check_answer_limits", "check_commit", "check_context",
    "check_revision",
    "check_completion", "check_identity", "check_proposal", "check_reply", "check_step",
    "choose_version", "identity_differences", "identity_named", "negotiate",
    "step_form", "Rows",
]
