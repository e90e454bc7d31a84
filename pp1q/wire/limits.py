"""Named limits of wire v2, each with the reason it exists.

Two kinds: hard caps (constants; no HELLO can raise them, so a hostile peer cannot
talk us into a large allocation) and negotiated ``Limits`` (exchanged in HELLO; the
answer carries the element-wise minimum of both sides' capacities). Every length a
frame header declares is checked against these before a byte of payload is buffered.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from pp1q.core.errors import LocalProtocolError, Reason, RemoteProtocolError

# -- integer field widths (msgspec constraints; a value outside is malformed control) --
U8 = Annotated[int, msgspec.Meta(ge=0, le=0xFF)]
U16 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFF)]
U24 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFFFF)]  # generation: 24 bits in the RNG counter
U32 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFFFFFF)]
U64 = Annotated[int, msgspec.Meta(ge=0)]  # msgpack itself caps integers at 2^64 - 1
I32 = Annotated[int, msgspec.Meta(ge=-(1 << 31), le=(1 << 31) - 1)]

# -- hard caps --
MAX_CONTROL_BYTES = 4096  # largest control part: a HELLO with every identity string at its cap
MAX_ID_CHARS = 128  # identity strings (checkpoint names, hashes) fit; bounds HELLO size
MAX_DETAIL_CHARS = 256  # refusal detail: enough for a diagnostic, never a data channel
MAX_VERSIONS_OFFERED = 8  # a HELLO lists a handful of wire versions, not an unbounded list
MAX_VOCAB = 1 << 24  # ids are int32 and a dense row is 64 MiB (plus 16 KiB of padding)
MAX_DENSE_LEN = MAX_VOCAB + 4096  # vocab plus tile padding (padding must be zero)
MAX_SLOTS_CAP = 1024  # slot ids index preallocated buffers; 1024 is far above any batch
MAX_DEPTH_CAP = 64  # fixed speculative depth; the design uses 5
MAX_INFLIGHT_CAP = 1024  # outstanding STEPs on one connection
ENTRY_BYTES_DENSE = 4  # FP32 q value
ENTRY_BYTES_SPARSE = 8  # int32 global id + FP32 q value
MAX_PAYLOAD_CAP = MAX_DENSE_LEN * ENTRY_BYTES_DENSE  # no frame payload is ever larger
MAX_CONTEXT_CAP = 1 << 20  # context tokens of one slot: 8x the default, 4 MiB of int32 ids
ENTRY_BYTES_TOKEN = 4  # int32 token id in a CONTEXT payload

# -- defaults (the seed's deployment: vocab 129280, 4 requests x depth 5, 2 batches) --
DEFAULT_VOCAB = 129280  # DeepSeek-V3 tokenizer
DEFAULT_MAX_SLOTS = 8  # two in-flight batches of four requests
DEFAULT_MAX_DEPTH = 5  # fixed depth five
DEFAULT_MAX_SUPPORT = 256  # sparse top-k up to the seed's largest screen (k=256)
DEFAULT_MAX_INFLIGHT = 8  # one outstanding STEP per slot
DEFAULT_MAX_CONTEXT = 1 << 17  # a prompt (<= 65536) plus the longest generation, with room
DEFAULT_STEP_TIMEOUT_S = 2.0  # watchdog deadline for one STEP (COMPLETION must arrive by then)


class Limits(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """Negotiated bounds. In HELLO: the sender's capacity; in the answer: the minimum.

    ``dense_len`` is the number of FP32 entries of a dense row (vocab, or more with
    zero padding); ``dense_row_bytes`` and ``sparse_row_bytes`` state each layout's
    exact (dense) or maximum (sparse) byte length so both ends size buffers alike.
    """

    max_slots: U16
    max_depth: U8
    max_support: U32
    max_inflight: U16
    dense_len: U32
    dense_row_bytes: U32
    sparse_row_bytes: U32
    # Revision 2. Absent in a revision-1 HELLO: decoded as 0 so that the revision check,
    # not the schema, refuses such a peer by name (bad_revision); check() refuses 0.
    max_context: U32 = 0  # committed context tokens one slot may hold (CONTEXT bound)

    @classmethod
    def make(
        cls,
        *,
        vocab: int = DEFAULT_VOCAB,
        max_slots: int = DEFAULT_MAX_SLOTS,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_support: int = DEFAULT_MAX_SUPPORT,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        dense_len: int | None = None,
        max_context: int = DEFAULT_MAX_CONTEXT,
    ) -> Limits:
        dense_len = vocab if dense_len is None else dense_len
        lim = cls(
            max_slots=max_slots,
            max_depth=max_depth,
            max_support=max_support,
            max_inflight=max_inflight,
            dense_len=dense_len,
            dense_row_bytes=dense_len * ENTRY_BYTES_DENSE,
            sparse_row_bytes=max_support * ENTRY_BYTES_SPARSE,
            max_context=max_context,
        )
        lim.check(vocab, LocalProtocolError)
        return lim

    @property
    def max_payload(self) -> int:
        """Largest REPLY payload these limits allow (dense row or full sparse row)."""
        return max(self.dense_row_bytes, self.sparse_row_bytes)

    @property
    def max_context_bytes(self) -> int:
        """Largest CONTEXT payload these limits allow (every context token at once)."""
        return self.max_context * ENTRY_BYTES_TOKEN

    def check(self, vocab: int, err: type = RemoteProtocolError) -> None:
        """Internal consistency and hard caps; ``err`` is Local for ours, Remote for a peer's."""
        if not 0 < vocab <= MAX_VOCAB:
            raise err(Reason.WRONG_IDENTITY, f"vocab {vocab} outside (0, {MAX_VOCAB}]")
        if not 0 < self.max_slots <= MAX_SLOTS_CAP:
            raise err(Reason.SLOT_OUT_OF_RANGE, f"max_slots {self.max_slots}")
        if not 0 < self.max_depth <= MAX_DEPTH_CAP:
            raise err(Reason.DEPTH_TOO_LARGE, f"max_depth {self.max_depth}")
        if not 0 < self.max_inflight <= MAX_INFLIGHT_CAP:
            raise err(Reason.TOO_MANY_INFLIGHT, f"max_inflight {self.max_inflight}")
        if not 0 <= self.max_support <= vocab:
            raise err(Reason.SUPPORT_TOO_LARGE, f"max_support {self.max_support} > vocab")
        if not vocab <= self.dense_len <= MAX_DENSE_LEN:
            raise err(Reason.UNEXPECTED_SIZE, f"dense_len {self.dense_len} for vocab {vocab}")
        if self.dense_row_bytes != self.dense_len * ENTRY_BYTES_DENSE:
            raise err(Reason.UNEXPECTED_SIZE, f"dense_row_bytes {self.dense_row_bytes}")
        if self.sparse_row_bytes != self.max_support * ENTRY_BYTES_SPARSE:
            raise err(Reason.UNEXPECTED_SIZE, f"sparse_row_bytes {self.sparse_row_bytes}")
        if not 0 < self.max_context <= MAX_CONTEXT_CAP:
            raise err(Reason.CONTEXT_TOO_LONG, f"max_context {self.max_context}")

    def meet(self, other: Limits) -> Limits:
        """Element-wise minimum of two capacities (both must describe the same dense row)."""
        if other.dense_len != self.dense_len:
            raise RemoteProtocolError(
                Reason.UNEXPECTED_SIZE, f"dense_len {other.dense_len} != {self.dense_len}"
            )
        support = min(self.max_support, other.max_support)
        return Limits(
            max_slots=min(self.max_slots, other.max_slots),
            max_depth=min(self.max_depth, other.max_depth),
            max_support=support,
            max_inflight=min(self.max_inflight, other.max_inflight),
            dense_len=self.dense_len,
            dense_row_bytes=self.dense_row_bytes,
            sparse_row_bytes=support * ENTRY_BYTES_SPARSE,
            max_context=min(self.max_context, other.max_context),
        )


DEFAULT_LIMITS = Limits.make()
