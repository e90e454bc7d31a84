"""dyadic24-standard-v1: the categorical q that samples a draft token, exactly.

q(v) = c_v / MASS with integer counts c_v >= 0 summing to exactly MASS = 2^24.
Every q(v) is exactly representable in FP32, so the wire carries FP32 values and
the receiver recovers the integer counts without any renormalisation.

Public, stable API: ``MASS``, ``SEMANTIC_ID``, ``DyadicRow``, ``build_row``,
``sample``, ``parse_dense``, ``parse_sparse``, ``validate_dense``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

import numpy as np

from pp1q.core import q_backend
from pp1q.core.errors import DistributionError, Reason, RowValidationError

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
    # Not a field: build_row's own int32 counts over the whole vocabulary, kept (read-only)
    # on a row it built with full support, so a dense REPLY is written in one sequential
    # pass instead of a scatter of the support (pp1q.wire.pool.ZeroRow). Equality,
    # validation and dataclasses.replace ignore it; rows parsed from the wire, top-k rows
    # and rows built any other way lack it (None).
    _dense: ClassVar[np.ndarray | None] = None

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
    def _proven(cls, vocab: int, ids: np.ndarray, counts: np.ndarray) -> DyadicRow:
        """A row whose parser has already proven every invariant of ``__post_init__``
        (ascending in-range int32 ids, positive int64 counts summing to MASS)."""
        row = object.__new__(cls)
        # the instance dict written at once: three frozen-dataclass setattrs cost 0.4 us
        row.__dict__.update(vocab=vocab, ids=ids, counts=counts)
        return row

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
        if not 0 <= token < self.vocab:  # outside every support (ids are in range)
            return 0
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

    def kept_dense_counts(self) -> np.ndarray | None:
        """The read-only int32 counts of every id (``vocab`` of them) build_row computed
        for this row, or None where it kept none (see ``_dense``)."""
        return self._dense

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


# ---------------------------------------------------------------------------
# construction


def _weights(logits, temperature: float) -> np.ndarray:
    """FP64 softmax of logits / temperature, in as few full passes as numpy allows.

    The arithmetic is exactly x / T, minus max(x / T), exp, divided by the sum: the
    refusal checks ride on the max (NaN propagates through it, +inf is the max) instead
    of separate scans, and every temporary is reused in place.
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise DistributionError(Reason.BAD_TEMPERATURE, f"temperature {temperature!r}")
    if not math.isfinite(temperature) or temperature <= 0:
        raise DistributionError(Reason.BAD_TEMPERATURE, f"temperature {temperature!r}")
    if hasattr(logits, "detach"):  # a torch tensor, on any device
        logits = logits.detach().to("cpu").double().numpy()
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise DistributionError(Reason.UNEXPECTED_SIZE, f"logits shape {x.shape}")
    top = float(x.max())
    if math.isnan(top):
        raise DistributionError(Reason.NAN_LOGIT, "NaN logit")
    if top == math.inf:
        raise DistributionError(Reason.POSINF_LOGIT, "+inf logit")
    # max(x / T) == max(x) / T: correctly rounded division by T > 0 is monotone
    with np.errstate(over="ignore"):  # overflow is checked right below
        top = float(np.float64(top) / float(temperature))
    if top == math.inf:  # finite logit / tiny temperature overflowed
        raise DistributionError(Reason.BAD_TEMPERATURE, "logits/temperature overflow")
    if top == -math.inf:
        raise DistributionError(Reason.ZERO_MASS, "every logit is -inf")
    if temperature == 1:
        w = np.subtract(x, top)  # x / 1.0 is x exactly
    else:
        with np.errstate(over="ignore"):  # only towards -inf here: weight 0, as masked
            w = np.divide(x, float(temperature))
        w -= top
    np.exp(w, out=w)
    total = w.sum()
    if not (total > 0 and np.isfinite(total)):
        raise DistributionError(Reason.ZERO_MASS, f"effective mass {total}")
    w /= total
    return w


_SUBSAMPLE_STRIDE = 16  # _kth_largest brackets the answer with every 16th value
_SUBSAMPLE_MIN = 4096  # below this a plain partition is as fast


def _kth_largest(v: np.ndarray, r: int):
    """The r-th largest value of v (1 <= r <= v.size), exactly; never reorders v.

    A strided subsample brackets the answer: lo and hi are subsample values a little
    below and above its expected rank. If fewer than r values exceed hi and at least r
    reach lo, the answer lies in [lo, hi] and is found among the few values there.
    Otherwise (an unlucky subsample) partition everything. Same value either way.
    """
    n = v.size
    if n >= _SUBSAMPLE_MIN:
        sub = v[:: _SUBSAMPLE_STRIDE]
        j = r // _SUBSAMPLE_STRIDE
        margin = j // 8 + 8
        j_lo, j_hi = min(sub.size, j + margin), max(1, j - margin)  # ranks from the top
        part = np.partition(sub, (sub.size - j_lo, sub.size - j_hi))
        lo, hi = part[sub.size - j_lo], part[sub.size - j_hi]
        above = int(np.count_nonzero(v > hi))
        band = v[np.flatnonzero((v >= lo) & (v <= hi))]
        if above < r <= above + band.size:
            k = r - above  # k-th largest inside the band
            return np.partition(band, band.size - k)[band.size - k]
    return np.partition(v, n - r)[n - r]


def _top_k_ids(w: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest weights, ties by lowest id, ascending."""
    if k >= w.size:
        return np.arange(w.size, dtype=np.int64)
    kth = _kth_largest(w, k)
    above = np.flatnonzero(w > kth)
    tied = np.flatnonzero(w == kth)[: k - above.size]
    return np.sort(np.concatenate([above, tied]))


def _allocate(w: np.ndarray) -> np.ndarray:
    """Floor plus largest remainders of w * MASS (w normalised, FP64), ties by lowest index.

    Consumes ``w``: it is scaled in place into the remainders (one buffer, no temporaries).
    """
    frac = np.multiply(w, MASS, out=w)  # exact: a power-of-two scale
    # truncation is floor (frac >= 0); int32 holds every count (<= 2^24), converts a
    # third as fast as int64 and halves the dense counts build_row keeps on the row
    counts = frac.astype(np.int32)
    remaining = MASS - int(counts.sum())
    if not 0 <= remaining < MASS:
        raise DistributionError(
            Reason.ALLOCATION_INCONSISTENT, f"remaining tickets {remaining} not in [0, {MASS})"
        )
    if remaining:
        frac -= counts  # the fractional remainders, exactly (counts <= 2^24)
        # The remaining-th largest remainder over every entry: entries with w = 0 have
        # remainder 0, so when it is positive it is also the one among w > 0 entries.
        kth = _kth_largest(frac, remaining)
        if kth > 0:
            above = frac > kth
            counts += above
            tied = np.flatnonzero(frac == kth)[: remaining - int(np.count_nonzero(above))]
        else:  # fewer positive remainders than tickets: zero remainders of w > 0 qualify
            eligible = np.flatnonzero((counts > 0) | (frac > 0))  # w > 0, before scaling
            if remaining > eligible.size:
                raise DistributionError(
                    Reason.ALLOCATION_INCONSISTENT,
                    f"{remaining} tickets for {eligible.size} positive entries",
                )
            f = frac[eligible]
            kth = _kth_largest(f, remaining)
            above = eligible[f > kth]
            counts[above] += 1
            tied = eligible[f == kth][: remaining - above.size]
        counts[tied] += 1
    if int(counts.sum()) != MASS or int(counts.min()) < 0:
        raise DistributionError(Reason.ALLOCATION_INCONSISTENT, "final counts do not sum to MASS")
    return counts


def build_row(logits, *, temperature: float = 1.0, top_k: int | None = None) -> DyadicRow:
    """Build the dyadic q row that the proposal will be sampled from.

    ``logits`` covers the global vocabulary (the caller adds any Markov bias);
    -inf entries are masked. FP64 softmax of logits/temperature, then (top_k)
    the global support, then integer counts by floor plus largest remainders.
    """
    w = _weights(logits, temperature)
    vocab = int(w.size)
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k <= 0:
            raise DistributionError(Reason.BAD_TOP_K, f"top_k {top_k!r}")
        support = _top_k_ids(w, int(top_k))
        w = w[support]
        w = w / w.sum()
    counts = _allocate(w)
    keep = np.flatnonzero(counts > 0)  # a bool mask: several times faster than on int64
    ids = keep if top_k is None else support[keep]
    row = DyadicRow(vocab=vocab, ids=ids, counts=counts[keep])
    if top_k is None:  # the whole vocabulary's counts: a dense REPLY's q in one pass
        counts.flags.writeable = False
        object.__setattr__(row, "_dense", counts)
    return row


def sample(row: DyadicRow, u24: int) -> int:
    """The first id whose cumulative count is strictly greater than ``u24``."""
    if isinstance(u24, bool) or not 0 <= int(u24) < MASS or int(u24) != u24:
        raise DistributionError(Reason.DRAW_OUT_OF_RANGE, f"u24 {u24!r} not in [0, 2^24)")
    cum = np.cumsum(row.counts)
    return int(row.ids[int(np.searchsorted(cum, int(u24), side="right"))])


# ---------------------------------------------------------------------------
# wire forms -> counts (the receiver's only way in; no renormalisation anywhere)


_I4, _F4 = np.dtype("<i4"), np.dtype("<f4")  # the wire's id and q element types


def _as_array(values, dtype: np.dtype, what: str) -> np.ndarray:
    """A 1-D array of ``dtype`` (a little-endian 4-byte type) from an array or LE bytes."""
    if type(values) is np.ndarray:  # first: what decoded frames carry, once per row
        arr = values
    elif isinstance(values, (bytes, bytearray, memoryview)):
        if len(values) % 4:
            raise RowValidationError(Reason.UNEXPECTED_SIZE, f"{what}: {len(values)} bytes")
        return np.frombuffer(values, dtype=dtype)
    else:
        arr = np.asarray(values)
    if arr.dtype != dtype or arr.ndim != 1:
        raise RowValidationError(Reason.UNEXPECTED_SIZE, f"{what}: need 1-D {dtype}")
    return arr


def _counts_from_q(q: np.ndarray) -> np.ndarray:
    """Recover integer counts from FP32 q values; refuse anything not c/2^24."""
    bits = q.view(np.uint32)
    # One unsigned compare covers sign, NaN/inf and q > 1: every legal value is a
    # non-negative FP32 whose bit pattern is at most that of 1.0.
    bad = bits > _ONE_BITS
    if bad.any():
        v = q[np.flatnonzero(bad)[0]]
        if not np.isfinite(v):
            raise RowValidationError(Reason.NON_FINITE, f"q value {v}")
        if np.signbit(v):
            raise RowValidationError(Reason.NEGATIVE_VALUE, f"q value {v}")
        raise RowValidationError(Reason.WRONG_MASS, f"q value {v} > 1")
    scaled = q * _MASS_F32  # exact: a power-of-two scale of a value <= 1
    counts = scaled.astype(np.int64)
    if not np.array_equal(counts, scaled):
        raise RowValidationError(Reason.NON_DYADIC, "q value not a multiple of 2^-24")
    total = int(counts.astype(np.uint64).sum(dtype=np.uint64))
    if total != MASS:
        raise RowValidationError(Reason.WRONG_MASS, f"counts sum to {total}, not {MASS}")
    return counts


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


# entries per validation chunk: few numpy calls per row, yet each scratch buffer stays
# under glibc's 128 KiB mmap threshold, so it is recycled instead of page-faulted in
_CHUNK = 32000


def validate_dense(q, vocab: int, checked: bool = False) -> np.ndarray:
    """Every check of ``parse_dense`` without building the row; returns the FP32 view.

    One fused numba pass where pp1q.core.q_backend chose it (same decisions, same
    reasons), else ``_validate_dense_numpy``. ``checked``: ``q_backend.copy_scanned``
    passed every value of ``q`` as it copied them in (all legal, the mass exact over
    the whole array); then only the padding is left: zero, the row is valid as it is;
    not zero, the full check below finds the reason.
    """
    arr = _as_array(q, _F4, "dense q")
    if arr.size < vocab:
        raise RowValidationError(Reason.UNEXPECTED_SIZE, f"dense q has {arr.size} < {vocab}")
    if checked and (arr.size == vocab or not arr.view(np.uint32)[vocab:].any()):
        return arr  # (no padding: no reduction call, ~1.5 us even over nothing)
    k = q_backend.kernels_for(arr)
    if k is None:
        return _validate_dense_numpy(arr, vocab)
    q_backend.validate_fused(k, arr, vocab)
    return arr


def _validate_dense_numpy(arr: np.ndarray, vocab: int) -> np.ndarray:
    """numpy's passes (``arr`` FP32, at least ``vocab`` values). A dense row is 129280
    values: whole-row temporaries would cost more than the checks (allocation and page
    faults), so the dyadic and mass checks stream through small scratch buffers after
    one max over the bit patterns."""
    bits = arr.view(np.uint32)
    if bits.size and bits.max() > _ONE_BITS:
        _counts_from_q(arr)  # raises with the precise reason (non-finite, negative, > 1)
    if arr.size > vocab and bits[vocab:].any():
        raise RowValidationError(Reason.PADDING_NONZERO, "dense padding beyond vocab is not zero")
    n = min(_CHUNK, vocab)
    scaled, back = np.empty(n, np.float32), np.empty(n, np.float32)
    counts = np.empty(n, np.int32)
    total = 0
    for lo in range(0, vocab, _CHUNK):
        x = arr[lo:min(lo + _CHUNK, vocab)]
        s, c, b = scaled[:x.size], counts[:x.size], back[:x.size]
        np.multiply(x, _MASS_F32, out=s)  # exact: a power-of-two scale of values in [0, 1]
        np.copyto(c, s, casting="unsafe")  # truncation; <= 2^24 fits and converts back
        np.copyto(b, c, casting="unsafe")
        if not np.array_equal(b, s):  # a value < 2^-24 truncates to 0 and differs too
            raise RowValidationError(Reason.NON_DYADIC, "q value not a multiple of 2^-24")
        total += int(c.sum(dtype=np.int64))
    if total != MASS:
        raise RowValidationError(Reason.WRONG_MASS, f"counts sum to {total}, not {MASS}")
    return arr


def parse_dense(q, vocab: int) -> DyadicRow:
    """Dense FP32 q (array or LE bytes). Length ``vocab``, or longer with zero padding."""
    return dense_row_of_valid(validate_dense(q, vocab), vocab)


def dense_row_of_valid(arr: np.ndarray, vocab: int) -> DyadicRow:
    """The ``DyadicRow`` of an FP32 row ``validate_dense`` returned, not checked again:
    the verifier validates each dense row on arrival (in a read-only frame buffer) and
    builds its row only if a decision asks for it (pp1q.wire.validate.Rows)."""
    k = q_backend.kernels_for(arr)
    if k is not None:
        ids, counts = q_backend.extract(k, arr, vocab)
        return DyadicRow._proven(vocab, ids, counts)
    ids = np.flatnonzero(arr.view(np.uint32)[:vocab] != 0)  # bool nonzero: fast path
    counts = (arr[ids] * _MASS_F32).astype(np.int64)  # exact integers, proven above
    return DyadicRow._proven(vocab, ids.astype(np.int32), counts)


def parse_sparse(ids, q, vocab: int, token: int | None = None) -> DyadicRow:
    """Sparse (int32 ids, FP32 q), each as array or LE bytes; canonical support only.

    ``token``: the token this row proposed, which must hold q > 0 (``require_token``'s
    checks, made after the row's): one kernel call for both on the numba path."""
    id_arr = _as_array(ids, _I4, "sparse ids")
    q_arr = _as_array(q, _F4, "sparse q")
    if id_arr.size != q_arr.size:
        raise RowValidationError(Reason.UNEXPECTED_SIZE, "sparse ids and q differ in length")
    if id_arr.size == 0:
        raise RowValidationError(Reason.MISSING_Q, "empty sparse row")
    k = q_backend.kernels_for(id_arr, q_arr)
    if k is None:
        _check_support(id_arr, vocab, RowValidationError)
        counts = _counts_from_q(q_arr)  # int64, contiguous
        if not counts.all():
            raise RowValidationError(Reason.NON_CANONICAL, "sparse entry with zero q")
        id_arr = np.ascontiguousarray(id_arr)  # int32 already
        checked = -1
    else:  # same checks, one call; a token outside the vocabulary is refused below
        checked = token if token is not None and 0 <= token < vocab else -1
        counts = q_backend.parse_sparse_fused(k, id_arr, q_arr, vocab, checked)
    # every invariant of DyadicRow is proven above: skip re-checking it
    row = DyadicRow._proven(vocab, id_arr, counts)
    if token is not None and checked < 0:
        row.require_token(token)
    return row
