"""Wire v2 messages: typed msgspec Structs for the control part of every frame.

Each control Struct is ``array_like`` (encoded as a msgpack array in field order, so
the field order below IS the wire layout, see docs/wire.md) and refuses unknown
(extra) fields. REPLY, CONTEXT and PROPOSAL have a payload: raw little-endian arrays
after the control part, exposed as numpy arrays (``Reply.ids`` int32 for sparse rows,
``Reply.q`` FP32; ``Context.tokens`` int32; ``Proposal.ids`` and ``Proposal.q``: one
int32 / FP32 array a position).

Revision 2 of wire v2 added CONTEXT, ``Limits.max_context`` and the ``revision`` of
HELLO and its answer. Revision 3 (``WIRE_REVISION``) added PROPOSAL: a sparse step's
whole proposal (every position's fields and row, and the completion's totals) in one
frame. A peer of another revision is refused (bad_revision).
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec
import numpy as np

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.wire.limits import (
    I32,
    MAX_DEPTH_CAP,
    MAX_DETAIL_CHARS,
    MAX_ID_CHARS,
    MAX_VERSIONS_OFFERED,
    U8,
    U16,
    U24,
    U32,
    U64,
    Limits,
)

IdStr = Annotated[str, msgspec.Meta(max_length=MAX_ID_CHARS)]

# one value per drafted position (a PROPOSAL's lists): bounded by the hard depth cap, so
# its control part is bounded before the lists' lengths are compared with anything
_PER_POSITION = msgspec.Meta(max_length=MAX_DEPTH_CAP)
DetailStr = Annotated[str, msgspec.Meta(max_length=MAX_DETAIL_CHARS)]

WIRE_V1 = 1  # greedy: token ids only, no q
WIRE_V2 = 2  # sampled: every drafted token travels with the exact q that sampled it
KNOWN_VERSIONS = (WIRE_V1, WIRE_V2)
# The revision of wire v2 this code speaks, negotiated in HELLO (both sides must speak
# the same one). Revision 1 carried the request context on a separate connection;
# revision 2 answered a sparse step only row by row (REPLY ... COMPLETION).
WIRE_REVISION = 3
FIRST_REVISION = 1  # what a HELLO without a revision field (revision 1's layout) decodes to
CONNECTION_SLOT = -1  # Refusal.slot for a refusal about the whole connection (e.g. HELLO)


class MsgType(enum.IntEnum):
    """Frame header ``type`` byte."""

    HELLO = 1
    HELLO_ANSWER = 2
    STEP = 3
    REPLY = 4
    COMPLETION = 5
    COMMIT = 6
    RESET = 7
    REFUSAL = 8
    CONTEXT = 9  # revision 2: a slot's committed context (full, or appended)
    PROPOSAL = 10  # revision 3: a sparse step's every row and its totals, in one frame


class Form(enum.IntEnum):
    """Representation of the q row in a REPLY."""

    TOKEN_ONLY = 0  # v1 / greedy step: the token id, no q (never legal for a sampled step)
    DENSE = 1  # FP32 q for every entry of the dense row (dense_len >= vocab, padding zero)
    SPARSE = 2  # int32 ascending global ids, then FP32 q of each (positive q only)


class Status(enum.IntEnum):
    """COMPLETION status."""

    OK = 0
    ABORTED = 1  # the worker gave up on this step (``reason`` says why); nothing to consume


class _Control(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    pass


class Identity(_Control):
    """What both ends must agree on exactly (compared field by field at HELLO)."""

    q_semantic_id: IdStr  # pp1q.core.q.SEMANTIC_ID
    verifier_id: IdStr  # the standard-verifier algorithm id
    vocab: U32  # global vocabulary size (129280 by default)
    id_map_hash: IdStr  # hash of the global token id map (tokenizer)
    draft_id: IdStr  # draft checkpoint identity
    draft_adapted: bool  # False: native drafter for this target; True: adapted
    target_id: IdStr  # target model identity
    rng_abi: IdStr  # pp1q.core.rng.RNG_ABI_ID
    precision: IdStr  # "fp32-le": q values are little-endian IEEE-754 binary32


class Hello(_Control):
    """Verifier -> worker, first frame of a connection."""

    session: U64  # fresh per connection: reconnecting invalidates every older key
    versions: Annotated[list[U8], msgspec.Meta(min_length=1, max_length=MAX_VERSIONS_OFFERED)]
    identity: Identity
    limits: Limits  # the verifier's capacity
    revision: U8 = FIRST_REVISION  # of wire v2; absent (revision 1) decodes as 1, refused


class HelloAnswer(_Control):
    """Worker -> verifier: the chosen version and the negotiated (minimum) limits."""

    session: U64
    version: U8
    identity: Identity  # the worker's own view, for the verifier to compare
    limits: Limits
    revision: U8 = FIRST_REVISION  # echo of the HELLO's (the only one both speak)


class Step(_Control):
    """Verifier -> worker: draft ``depth`` tokens after the committed prefix."""

    session: U64
    slot: U16
    generation: U24  # request generation; a RESET moves the slot to a higher one
    round_id: U32  # strictly increasing within a generation
    last_committed: U32  # absolute position of the last committed token
    first_position: U32  # absolute position of x_1; always last_committed + 1
    prefix_digest: U64  # digest of the committed prefix / drafter state
    depth: U8  # fixed before sampling; never adapted from the draws
    temperature: float  # proposal temperature; 0 = greedy (token ids only)
    top_k: U32  # support policy: 0 = dense, k > 0 = sparse top-k
    context_version: U32  # target processor / grammar / stop context version
    seed: U64  # request seed: the RNG key of every draw of this request


class _ReplyHead(_Control):
    """The control part of a REPLY; ``Reply`` adds the payload arrays."""

    session: U64
    slot: U16
    generation: U24
    round_id: U32
    index: U8  # 1..depth, in order
    position: U32  # absolute position of this token: first_position + index - 1
    token: I32  # sampled global id
    form: U8  # Form
    entries: U32  # dense: dense_len; sparse: support size; token-only: 0


REPLY_HEAD_FIELDS = len(_ReplyHead.__struct_fields__)


class Reply(_ReplyHead, eq=False):
    """One drafted position: token plus the q row it was sampled from.

    ``q``: FP32 array (dense: ``entries`` values; sparse: one per id), ``ids``: int32
    ascending global ids (sparse only). Arrays decoded from the wire are read-only
    views of the frame's own buffer (no copy).
    """

    ids: object = None
    q: object = None

    def payload_parts(self) -> tuple[memoryview, ...]:
        """The payload as LE bytes: (), (q,) or (ids, q); checked against the head."""
        form = Form(self.form)
        if form is Form.TOKEN_ONLY:
            if self.entries or self.ids is not None or self.q is not None:
                raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "token-only reply with q")
            return ()
        q = _le_array(self.q, "<f4", self.entries, "q")
        if form is Form.DENSE:
            if self.ids is not None:
                raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "dense reply with ids")
            return (q,)
        return (_le_array(self.ids, "<i4", self.entries, "ids"), q)


def _le_array(arr, dtype: str, n: int, what: str) -> memoryview:
    """The array's bytes, LE, without a copy when it already has the wire layout."""
    if arr is None:
        raise LocalProtocolError(Reason.MISSING_Q, f"reply without {what}")
    a = np.asarray(arr)
    if a.ndim != 1 or a.size != n:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"{what} shape {a.shape} != ({n},)")
    if a.dtype != np.dtype(dtype):
        if a.dtype.kind != np.dtype(dtype).kind or a.dtype.itemsize != 4:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"{what} dtype {a.dtype}")
        a = a.astype(dtype)
    return memoryview(np.ascontiguousarray(a)).cast("B")


class _ContextHead(_Control):
    """The control part of a CONTEXT; ``Context`` adds the token ids (the payload)."""

    session: U64
    slot: U16
    generation: U24  # the generation whose STEPs will draft after this context
    start: U32  # absolute position of the first token carried: 0 opens, > 0 appends
    count: U32  # token ids in the payload (>= 1)
    digest: U64  # pp1q.core.prefix digest of the whole committed prefix after this


class Context(_ContextHead, eq=False):
    """Verifier -> worker: the committed tokens of ``slot`` from position ``start`` on.

    ``start`` 0 states the whole committed prefix (a request's prompt, or a full resend
    after a digest mismatch); ``start`` = the length the worker holds appends to it (the
    target-only token of a fallback). ``tokens``: int32 ids (decoded: a read-only view
    of the frame's payload). COMMIT appends the rest: accepted drafts plus its token.
    """

    tokens: object = None

    def payload_parts(self) -> tuple[memoryview, ...]:
        return (_le_array(self.tokens, "<i4", self.count, "tokens"),)


def context_of(*, session: int, slot: int, generation: int, tokens, start: int = 0,
               digest: int) -> Context:
    """A CONTEXT carrying ``tokens`` (any int sequence) from ``start``."""
    ids = np.asarray(tokens, dtype=np.int64)
    if ids.ndim != 1 or ((ids < -(1 << 31)) | (ids >= 1 << 31)).any():
        raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, "context ids must be int32")
    return Context(session=session, slot=slot, generation=generation, start=start,
                   count=int(ids.size), digest=digest, tokens=ids.astype("<i4"))


class Completion(_Control):
    """Worker -> verifier after the last REPLY of a step: the exact totals to check."""

    session: U64
    slot: U16
    generation: U24
    round_id: U32
    first_position: U32
    context_version: U32
    rows: U8  # REPLY frames sent for this step (= depth when OK)
    reply_bytes: U64  # total bytes of those REPLY frames (header + control + payload)
    reply_checksum: U64  # xxh3_64 of their 8-byte LE payload checksums, in index order
    status: U8  # Status
    reason: Annotated[str, msgspec.Meta(max_length=64)]  # "" when OK, else a Reason value


class _ProposalHead(_Control):
    """The control part of a PROPOSAL; ``Proposal`` adds the payload arrays."""

    session: U64
    slot: U16
    generation: U24
    round_id: U32
    first_position: U32  # absolute position of x_1 (position i is first_position + i - 1)
    context_version: U32
    tokens: Annotated[list[I32], _PER_POSITION]  # sampled global id of each position, in order
    entries: Annotated[list[U32], _PER_POSITION]  # support size of each position's sparse row
    # xxh3_64 of each row's payload bytes (ids, then q): its REPLY's payload_xxh3
    row_checksums: Annotated[list[U64], _PER_POSITION]


PROPOSAL_HEAD_FIELDS = len(_ProposalHead.__struct_fields__)


class Proposal(_ProposalHead, eq=False):
    """Worker -> verifier: a sparse step's whole proposal in one frame (revision 3).

    Position i carries what its REPLY would: ``tokens[i]``, ``entries[i]``, its row
    (``ids[i]`` int32 ascending global ids, ``q[i]`` FP32) and that row's probability
    checksum ``row_checksums[i]`` (the payload_xxh3 its REPLY would carry). The payload
    is the rows in order, each its ids then its q; the frame's own payload checksum
    (xxh3_64 of the whole payload, not a chain of ``row_checksums`` as a COMPLETION's
    reply_checksum is) and length stand in for a completion's checksum and exact size
    (a proposal that arrives whole needs no COMPLETION). Decoded, ``ids`` and ``q`` are
    read-only views of the frame's payload (``Frame.words``: all of it as int32 words).
    """

    ids: object = None  # tuple of int32 arrays, one per position
    q: object = None  # tuple of FP32 arrays, one per position

    def payload_parts(self) -> tuple[memoryview, ...]:
        """The payload as LE bytes: (ids_1, q_1, ids_2, q_2, ...), checked against the head."""
        n = len(self.entries)
        if self.ids is None or self.q is None:
            raise LocalProtocolError(Reason.MISSING_Q, "proposal without rows")
        if not len(self.tokens) == len(self.row_checksums) == len(self.ids) == len(self.q) == n:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "proposal fields of unequal length")
        parts = []
        for ids, q, k in zip(self.ids, self.q, self.entries, strict=True):
            parts += (_le_array(ids, "<i4", k, "ids"), _le_array(q, "<f4", k, "q"))
        return tuple(parts)


class Commit(_Control):
    """Verifier -> worker: the verification outcome of one round."""

    session: U64
    slot: U16
    generation: U24
    round_id: U32
    accepted: U8  # accepted draft tokens (0..depth)
    token: I32  # the correction (accepted < depth) or bonus (accepted = depth) id
    committed: U32  # new absolute position of the last committed token (last_committed+accepted+1)


class Reset(_Control):
    """Verifier -> worker: cancel. Generations <= ``generation`` of the slot are dead:
    probability slots, speculative Markov/KV/grammar state and RNG keys under them."""

    session: U64
    slot: U16
    generation: U24
    reason: Reason  # CANCELLED when nothing went wrong


class Refusal(_Control):
    """Either direction: a request refused, with a closed-set reason.

    ``slot`` is CONNECTION_SLOT (-1) for a refusal of the connection itself (HELLO).
    """

    session: U64
    slot: Annotated[int, msgspec.Meta(ge=CONNECTION_SLOT, le=0xFFFF)]
    generation: U24
    round_id: U32
    reason: Reason
    detail: DetailStr


MESSAGE_CLASSES: dict[MsgType, type] = {
    MsgType.HELLO: Hello,
    MsgType.HELLO_ANSWER: HelloAnswer,
    MsgType.STEP: Step,
    MsgType.REPLY: Reply,
    MsgType.COMPLETION: Completion,
    MsgType.COMMIT: Commit,
    MsgType.RESET: Reset,
    MsgType.REFUSAL: Refusal,
    MsgType.CONTEXT: Context,
    MsgType.PROPOSAL: Proposal,
}
TYPE_OF: dict[type, MsgType] = {cls: t for t, cls in MESSAGE_CLASSES.items()}


def type_of(msg) -> MsgType:
    """The MsgType of a message object; LocalProtocolError for anything else."""
    t = TYPE_OF.get(type(msg))
    if t is None:
        raise LocalProtocolError(Reason.UNKNOWN_MESSAGE_TYPE, f"not a wire message: {msg!r}")
    return t


# frames with a payload: the control part is the head, the payload arrays follow it
HEAD_CLASSES: dict[MsgType, type] = {MsgType.REPLY: _ReplyHead, MsgType.CONTEXT: _ContextHead,
                                     MsgType.PROPOSAL: _ProposalHead}
CONTROL_CLASSES: dict[MsgType, type] = {**MESSAGE_CLASSES, **HEAD_CLASSES}
CONTEXT_HEAD_FIELDS = len(_ContextHead.__struct_fields__)

Message = (Hello | HelloAnswer | Step | Reply | Completion | Commit | Reset | Refusal | Context
           | Proposal)
