"""dyadic24-standard-v1: the categorical q that samples a draft token, exactly.

q(v) = c_v / MASS with integer counts c_v >= 0 summing to exactly MASS = 2^24.
Every q(v) is exactly representable in FP32, so the wire carries FP32 values and
the receiver recovers the integer counts without any renormalisation.

Public, stable API: ``MASS``, ``SEMANTIC_ID``, ``DyadicRow``, ``build_row``,
``sample``, ``parse_dense``, ``parse_sparse``, ``validate_dense``.
"""

from __future__ import annotations

import math

import numpy as np

from pp1q.core import q_backend
from pp1q.core.errors import DistributionError, Reason

# the row type and the parsers live in their own modules; this one builds rows and is
# the stable import path of all of them (pp1q.q is this module)
from pp1q.core.q_parse import (  # noqa: F401 - re-exported
    _support_of_valid,
    dense_row_of_valid,
    parse_dense,
    parse_sparse,
    parse_sparse_rows,
    validate_dense,
)
from pp1q.core.q_row import _MASS_F32, MASS, SEMANTIC_ID, DyadicRow  # noqa: F401 - re-exported

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
    Where the kernels run, one call (pp1q.core.q_scan.allocate: five passes instead of
    about twelve); the same counts either way (tests/core/test_q_alloc.py).
    """
    k = q_backend.kernels_for(w)
    if k is not None:
        counts = np.empty(w.size, dtype=np.int32)
        q_backend.allocate_fused(k, w, counts)
        return _checked_total(counts)
    frac = np.multiply(w, MASS, out=w)  # exact: a power-of-two scale
    # truncation is floor (frac >= 0); int32 holds every count (<= 2^24) and converts a
    # third as fast as int64
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
        # (more tickets than entries: only the refusal below can follow)
        kth = _kth_largest(frac, remaining) if remaining <= frac.size else 0.0
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
    return _checked_total(counts)


def _checked_total(counts: np.ndarray) -> np.ndarray:
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
    counts = _allocate(w)  # checked there: they sum to MASS, none negative
    # Every invariant of a row holds by construction, so it is not checked again (that
    # took 0.2 ms of a dense row's 1.4): ids ascending (flatnonzero, or the top-k
    # support sorted) and in range, counts positive, summing to MASS.
    if top_k is not None:
        keep = np.flatnonzero(counts > 0)  # a bool mask: several times faster than on int64
        return DyadicRow._proven(vocab, support[keep].astype(np.int32),
                                 counts[keep].astype(np.int64))
    # the whole vocabulary's q (a dense REPLY's payload as it is sent), and the support
    # read from it as from a received dense row: one kernel pass each where numba runs
    q = _dense_q_of(counts)
    ids, kept = _support_of_valid(q, vocab)
    return DyadicRow._proven(vocab, ids, kept, dense_q=q)


def _dense_q_of(counts: np.ndarray) -> np.ndarray:
    """counts / 2^24 as a read-only FP32 row (exact: every count <= 2^24 is an FP32
    integer and 2^-24 a power of two), in one pass where the kernels run."""
    q = np.empty(counts.size, dtype=np.float32)
    k = q_backend.kernels_for(counts)
    if k is None:
        np.divide(counts, _MASS_F32, out=q, casting="unsafe")
    else:
        k.dense_from_counts(q, counts)
    q.flags.writeable = False
    return q


def sample(row: DyadicRow, u24: int) -> int:
    """The first id whose cumulative count is strictly greater than ``u24``."""
    if isinstance(u24, bool) or not 0 <= int(u24) < MASS or int(u24) != u24:
        raise DistributionError(Reason.DRAW_OUT_OF_RANGE, f"u24 {u24!r} not in [0, 2^24)")
    whole = row.dense_q()  # a received dense row, or one build_row built: its FP32 q
    if whole is not None:
        k = q_backend.kernels_for(whole)
        if k is not None:  # one pass to the id: no support extracted, no cumsum written
            i = k.first_past(whole, _MASS_F32, int(u24))
            if i >= row.vocab:  # unreachable for a row (its counts sum to MASS > u24)
                raise DistributionError(Reason.WRONG_MASS, "row counts end below the draw")
            return int(i)
    cum = np.cumsum(row.counts)
    return int(row.ids[int(np.searchsorted(cum, int(u24), side="right"))])
