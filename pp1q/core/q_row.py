"""The dyadic24 row: q(v) = c_v / MASS with integer counts c_v >= 0 summing to exactly
MASS = 2^24, every q(v) exact in FP32. The type and its invariants; pp1q.core.q builds
rows (build_row, sample) and pp1q.core.q_parse reads them from the wire. Import them
from pp1q.core.q (or the stable pp1q.q), which re-exports this module's public names.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

import numpy as np

from pp1q.core.errors import Reason, RowValidationError

MASS = 1 << 24
SEMANTIC_ID = "dyadic24-standard-v1"

_MASS_F32 = np.float32(MASS)
_ONE_BITS = np.uint32(0x3F800000)  # FP32 1.0: the largest legal q value


@dataclass(frozen=True, eq=False)
class DyadicRow:
    """A dyadic categorical row over a global vocabulary.

    ``ids`` are strictly ascending int32 global ids of the support (count > 0 only),
    ``counts`` the matching int64 counts, summing to exactly ``MASS``.
    """

    vocab: int
    ids: np.ndarray
    counts: np.ndarray
    # Not a field: (token, count) for the token this row's parser proved it holds
    # (a PROPOSAL's proposed token), so ``count_of`` answers the verifier's ratio test for
    # it without a search. Equality, validation and dataclasses.replace ignore it (and
    # ``_dense_q``); None on every other row.
    _drawn: ClassVar[tuple[int, int] | None] = None
    # Not a field either: the row's read-only FP32 q over its whole vocabulary (count =
    # q * 2^24 at each id, 0 elsewhere), where it has one: a received dense row's
    # validated payload, read in place (pp1q.core.q_parse.dense_row_of_valid: its ids and
    # counts are extracted on first read, ``__getattr__``), or the q build_row wrote for
    # a full-support row (ids and counts set as well). A dense REPLY sends it as it is,
    # and the kernels (draws, the verifier's residual pick) read it instead of the
    # support. None on every other row (top-k, parsed sparse, built any other way).
    _dense_q: ClassVar[np.ndarray | None] = None

    def __post_init__(self) -> None:
        raw_ids = np.asarray(self.ids)
        _check_support(raw_ids, self.vocab, RowValidationError)  # before any narrowing cast
        ids = np.ascontiguousarray(raw_ids, dtype=np.int32)
        counts = np.ascontiguousarray(self.counts, dtype=np.int64)
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "counts", counts)
        if ids.shape != counts.shape:
            raise RowValidationError(Reason.UNEXPECTED_SIZE, "ids and counts differ in length")
        if counts.size == 0:
            raise RowValidationError(Reason.WRONG_MASS, "empty support")
        if int(counts.min()) <= 0:
            raise RowValidationError(Reason.NON_CANONICAL, "support holds a zero count")
        total = int(counts.astype(np.uint64).sum(dtype=np.uint64))
        if total != MASS:
            raise RowValidationError(Reason.WRONG_MASS, f"counts sum to {total}, not {MASS}")

    @classmethod
    def _proven(cls, vocab: int, ids: np.ndarray, counts: np.ndarray,
                drawn: tuple[int, int] | None = None,
                dense_q: np.ndarray | None = None) -> DyadicRow:
        """A row whose parser (or build_row) has already proven every invariant of
        ``__post_init__`` (ascending in-range int32 ids, positive int64 counts summing to
        MASS), ``drawn`` = (token, its count) where it found the proposed token's count,
        and ``dense_q`` its read-only FP32 q over the vocabulary where it has one."""
        row = object.__new__(cls)
        # the instance dict written at once: frozen-dataclass setattrs cost 0.1 us each
        row.__dict__.update(vocab=vocab, ids=ids, counts=counts, _drawn=drawn,
                            _dense_q=dense_q)
        return row

    @classmethod
    def _in_place(cls, vocab: int, q: np.ndarray, extract) -> DyadicRow:
        """A row over a dense FP32 ``q`` its parser validated (every invariant of
        ``__post_init__`` holds for its support); ``extract(q, vocab)`` gives (ids,
        counts) when first read; ``count_of`` reads ``q`` itself."""
        row = object.__new__(cls)
        row.__dict__.update(vocab=vocab, _dense_q=q, _extract=extract)
        return row

    def __getattr__(self, name: str):
        # reached only for a name not in the instance dict: an in-place dense row's ids
        # and counts before their first read
        d = self.__dict__
        if name not in ("ids", "counts") or d.get("_dense_q") is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        d["ids"], d["counts"] = d["_extract"](d["_dense_q"], d["vocab"])
        return d[name]

    def dense_q(self) -> np.ndarray | None:
        """The row's read-only FP32 q over its whole vocabulary (count = q * 2^24 at each
        id), or None where it holds its support only (see ``_dense_q``)."""
        return self._dense_q

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DyadicRow):
            return NotImplemented
        return (
            self.vocab == other.vocab
            and np.array_equal(self.ids, other.ids)
            and np.array_equal(self.counts, other.counts)
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def support_size(self) -> int:
        return int(self.ids.size)

    def count_of(self, token: int) -> int:
        """Count of ``token`` (0 outside the support)."""
        drawn = self._drawn
        if drawn is not None and drawn[0] == token:
            return drawn[1]
        if not 0 <= token < self.vocab:  # outside every support (ids are in range)
            return 0
        whole = self._dense_q
        if whole is not None:  # one read: no search, and an in-place row extracts nothing
            return int(whole[token] * _MASS_F32)  # exact: an FP32 integer <= 2^24
        # an int32 needle: a Python int makes numpy cast the whole int32 id array to
        # int64 first (15 us for a dense row's 86k ids, 2 us this way)
        i = int(self.ids.searchsorted(np.int32(token)))
        if i < self.ids.size and int(self.ids[i]) == token:
            return int(self.counts[i])
        return 0

    def prob(self, token: int) -> Fraction:
        """Exact q(token)."""
        return Fraction(self.count_of(token), MASS)

    def require_token(self, token: int) -> int:
        """Count of a proposed token; a proposed token must have q > 0."""
        if not 0 <= token < self.vocab:
            raise RowValidationError(Reason.ID_OUT_OF_RANGE, f"token {token} outside vocab")
        c = self.count_of(token)
        if c == 0:
            raise RowValidationError(Reason.ZERO_Q_AT_TOKEN, f"q({token}) = 0")
        return c

    def dense_counts(self) -> np.ndarray:
        out = np.zeros(self.vocab, dtype=np.int64)
        out[self.ids] = self.counts
        return out

    def to_dense(self) -> np.ndarray:
        """Dense FP32 q of length ``vocab`` (exact: counts <= 2^24)."""
        out = np.zeros(self.vocab, dtype=np.float32)
        out[self.ids] = self.counts.astype(np.float32) / _MASS_F32
        return out

    def to_sparse(self) -> tuple[np.ndarray, np.ndarray]:
        """(int32 ascending global ids, FP32 q) of the support."""
        return self.ids.copy(), self.counts.astype(np.float32) / _MASS_F32


def _check_support(ids: np.ndarray, vocab: int, err: type) -> None:
    if ids.size == 0:
        return
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise err(Reason.ID_OUT_OF_RANGE, f"support id outside [0, {vocab})")
    if ids.size > 1:
        step = np.diff(ids)
        if (step == 0).any():
            raise err(Reason.DUPLICATE_ID, "duplicate support id")
        if (step < 0).any():
            raise err(Reason.UNSORTED_SUPPORT, "support ids not ascending")
