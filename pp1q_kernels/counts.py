"""Global softmax weights and dyadic24 counts (kernel 1), batched over rows.

Follows pp1q.core.q.build_row step by step: FP64 x = logits / T, global max, e = exp(x - max),
total, w = e / total, (top-k support, renormalise), then floor(w * 2^24) plus one ticket
for each of the ``remaining`` largest fractional remainders, ties by lowest global id.

On the CPU, where pp1q.core.q_backend's choice is numba (the one that runs build_row's
allocation), the total's limbs come from one numba pass (numba_counts.sum_limbs) and a
dense row's counts from build_row's own kernel, a row at a time (``allocate_rows``;
dispatch.allocate picks it; a top-k support's k weights are allocated by the torch
form): the same integers as the torch forms below, which stay the reference (and
the path everywhere else).

Numerics. The max, floors, fractions, remainder order and tie rule are exact, so given
the same FP64 weights the counts equal build_row's bit for bit on every backend and
sharding. The total is ``fixed.exact_sum`` (order-independent limbs, so shards and
tiles agree exactly); build_row uses numpy's pairwise sum and numpy's exp, which can
differ from it (and from torch's exp) by an ulp. Counts then differ only if some
w * 2^24 lies within about 2^-28 of an integer or of the tie boundary between two
remainders: measured never in the test corpus, estimated under 1e-4 per 129280-token row.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pp1q.core import q_backend
from pp1q.core.errors import DistributionError, Reason
from pp1q.core.q import MASS

from .cpu_rows import numba_rows
from .fixed import SUM_MAX_ENTRIES, exact_sum, limbs_to_float
from .lookup import SparseCounts, compact
from .topk import topk_support

SORT_MAX = 4096  # rows up to this width find their remainder threshold by sorting
HIST_BITS = 12  # wider rows: a 2^12-bin histogram first (~32 keys per bin at 129280)
_NO_THRESHOLD = 2.0  # above every fractional remainder: rows with no remaining tickets


def scaled_logits(logits: torch.Tensor, temperature):
    """(x = logits / T in FP64, row max of x), refusing what build_row refuses.

    The row max is needed anyway; NaN and +inf show in it, so the clean path costs no
    extra pass and the diagnosis (NaN, then +inf, then overflow) runs only on failure.
    """
    t = torch.as_tensor(temperature, dtype=torch.float64, device=logits.device)
    if not bool(torch.isfinite(t).all()) or not bool((t > 0).all()):
        raise DistributionError(Reason.BAD_TEMPERATURE, f"temperature {temperature!r}")
    # one fresh FP64 copy, divided in place: a whole-batch temporary (a write and a
    # read of megabytes) less; the caller owns x
    x = logits.to(torch.float64, copy=True).div_(t.unsqueeze(-1) if t.dim() else t)
    xmax = x.amax(-1, keepdim=True)  # NaN propagates through amax
    if not bool((xmax < math.inf).all()):
        if bool(torch.isnan(logits).any()):
            raise DistributionError(Reason.NAN_LOGIT, "NaN logit")
        if bool(torch.isposinf(logits).any()):
            raise DistributionError(Reason.POSINF_LOGIT, "+inf logit")
        raise DistributionError(Reason.BAD_TEMPERATURE, "logits/temperature overflow")
    return x, xmax


def check_max(gmax: torch.Tensor) -> None:
    if not bool(torch.isfinite(gmax).all()):
        raise DistributionError(Reason.ZERO_MASS, "every logit is -inf")


def check_total(total: torch.Tensor) -> None:
    if not bool(((total > 0) & torch.isfinite(total)).all()):
        raise DistributionError(Reason.ZERO_MASS, "no effective mass")


def softmax_weights(logits: torch.Tensor, temperature=1.0) -> torch.Tensor:
    """Normalised FP64 weights w [..., V] (the sharded form is in shard_emulator)."""
    x, gmax = scaled_logits(logits, temperature)
    check_max(gmax)
    e = x.sub_(gmax).exp_()  # in place: x is scaled_logits' own copy
    total = _exact_total(e).unsqueeze(-1)
    check_total(total)
    return e.div_(total)


def logsumexp(logits: torch.Tensor, temperature=1.0) -> torch.Tensor:
    """Global log-normaliser max + log(total) of logits / T (FP64)."""
    x, gmax = scaled_logits(logits, temperature)
    check_max(gmax)
    return (gmax + torch.log(_exact_total(x.sub_(gmax).exp_()).unsqueeze(-1))).squeeze(-1)


# ---------------------------------------------------------------------------
# allocation


def floors(w: torch.Tensor):
    """(floor counts int64, keys, eligible count) of w * 2^24.

    key = the fractional remainder, or -1 where w == 0 (never eligible for a ticket).
    """
    scaled = w * MASS  # exact: a power-of-two scale
    zero = scaled == 0
    key = torch.frac(scaled).masked_fill_(zero, -1.0)
    return scaled.to(torch.int64), key, w.shape[-1] - zero.sum(-1)  # trunc == floor here


def check_remaining(remaining: torch.Tensor, eligible: torch.Tensor) -> None:
    if not bool(((remaining >= 0) & (remaining < MASS)).all()):
        raise DistributionError(Reason.ALLOCATION_INCONSISTENT, "remaining tickets out of range")
    if not bool((remaining <= eligible).all()):
        raise DistributionError(Reason.ALLOCATION_INCONSISTENT, "more tickets than entries")


def kth_largest(key: torch.Tensor, k: torch.Tensor, method: str | None = None) -> torch.Tensor:
    """The k-th largest key per row [...] (keys in [0, 1) or -1; 1 <= k <= #keys >= 0).

    "hist": bin the keys monotonically (any monotone binning works: the k-th largest
    lies in the bin where the count from the top reaches k), then top-k in that bin.
    """
    n = key.shape[-1]
    method = method or ("sort" if n <= SORT_MAX else "hist")
    if method == "sort":
        top = torch.sort(key, dim=-1, descending=True).values
        return top.gather(-1, (k - 1).unsqueeze(-1)).squeeze(-1)
    nb = 1 << HIST_BITS
    bins = torch.add(nb, key, alpha=nb).to(torch.int64)  # -1 -> bin 0; [0, 1) -> [nb, 2 nb]
    hist = torch.zeros(*key.shape[:-1], 2 * nb + 1, dtype=torch.int64, device=key.device)
    hist.scatter_add_(-1, bins, torch.ones((), dtype=torch.int64, device=key.device)
                      .expand_as(bins))
    at_least = hist[..., nb:].flip(-1).cumsum(-1).flip(-1)  # keys in bins >= nb + j
    j = (at_least >= k.unsqueeze(-1)).sum(-1) - 1  # the bin holding the k-th largest
    above = torch.cat([at_least, torch.zeros_like(at_least[..., :1])], -1)
    k_in = k - above.gather(-1, (j + 1).unsqueeze(-1)).squeeze(-1)
    cand = torch.where(bins == (j + nb).unsqueeze(-1), key, -1.0)
    top = torch.topk(cand, int(k_in.max()), dim=-1).values
    return top.gather(-1, (k_in - 1).unsqueeze(-1)).squeeze(-1)


def tickets(key: torch.Tensor, remaining: torch.Tensor) -> torch.Tensor:
    """The extra-ticket mask: the ``remaining`` largest keys, ties by lowest id."""
    has = remaining > 0
    kth = kth_largest(key, torch.where(has, remaining, 1))
    return ticket_mask(key, torch.where(has, kth, _NO_THRESHOLD), remaining)


def ticket_mask(key, kth, remaining, before=None, above_total=None) -> torch.Tensor:
    """Keys above the threshold, then the lowest-id ties until ``remaining`` is met.

    ``before``/``above_total``: ties held by lower-id shards and the global count above
    the threshold (sharded form). Unsharded, the usual case is one pass: exactly
    ``remaining`` keys are >= the threshold.
    """
    kth = kth.unsqueeze(-1)
    if before is None and above_total is None:
        at_least = key >= kth
        if bool((at_least.sum(-1) == remaining).all()):
            return at_least
    above = key > kth
    tied = key == kth
    n_above = above.sum(-1) if above_total is None else above_total
    need = (remaining - n_above).unsqueeze(-1)
    offset = 0 if before is None else before.unsqueeze(-1)
    return above | (tied & (tied.cumsum(-1) + offset <= need))


def allocate(w: torch.Tensor) -> torch.Tensor:
    """Counts [..., n] int64 for normalised FP64 weights w, exactly pp1q.core.q's rule."""
    fl, key, eligible = floors(w)
    remaining = MASS - fl.sum(-1)
    check_remaining(remaining, eligible)
    counts = fl.add_(tickets(key, remaining))
    if not bool((counts.sum(-1) == MASS).all()):
        raise DistributionError(Reason.ALLOCATION_INCONSISTENT, "counts do not sum to MASS")
    return counts


def allocate_rows(kernels, w: torch.Tensor, consume: bool = False) -> torch.Tensor:
    """``allocate``'s counts from build_row's kernel (pp1q.core.q_scan.allocate, the
    ``kernels`` module), a row at a time into the int64 result: CPU weights only. The
    kernel turns its input into remainders: each row is copied into one reused scratch
    row first, unless ``consume`` (the caller's own temporary ``w``, float64 and
    contiguous, may be overwritten). Refuses what ``allocate`` refuses, and weights
    outside [0, 1] as well (build_row's check)."""
    n = w.shape[-1]
    rows = w.detach().reshape(-1, n)
    if rows.dtype != torch.float64 or not rows.is_contiguous():
        rows, consume = rows.to(torch.float64).contiguous(), True  # a copy of our own
    src = rows.numpy()
    out = torch.empty(rows.shape, dtype=torch.int64)
    scratch = None if consume else np.empty(n, np.float64)
    for r, counts in enumerate(out.numpy()):
        row = src[r]
        if scratch is not None:
            scratch[:] = row
            row = scratch
        q_backend.allocate_fused(kernels, row, counts)  # raises build_row's refusals
    if not bool((out.sum(-1) == MASS).all()):
        raise DistributionError(Reason.ALLOCATION_INCONSISTENT, "counts do not sum to MASS")
    return out.reshape(w.shape)


def _exact_total(x: torch.Tensor) -> torch.Tensor:
    """fixed.exact_sum of rows of float64 values in [0, 1]; on the CPU where numba runs
    build_row's allocation, its limbs from one numba pass (the same limbs, so the same
    float64)."""
    fast = numba_rows(x) if x.shape[-1] <= SUM_MAX_ENTRIES else None
    if fast is None:
        return exact_sum(x)  # refuses a row too wide for its limbs, as before
    numba_counts, rows = fast
    hi, lo = np.empty(rows.shape[0], np.int64), np.empty(rows.shape[0], np.int64)
    numba_counts.sum_limbs(rows, hi, lo)
    lead = x.shape[:-1]
    return limbs_to_float(torch.from_numpy(hi).reshape(lead), torch.from_numpy(lo).reshape(lead))


def support_counts(ws: torch.Tensor, ids: torch.Tensor, vocab: int) -> SparseCounts:
    """Counts on a top-k support (weights ws at ids): renormalise, allocate, drop zeros."""
    total = _exact_total(ws).unsqueeze(-1)
    check_total(total)
    counts = allocate(ws / total)
    return compact(ids, counts, counts > 0, vocab)


def build_counts(logits: torch.Tensor, temperature=1.0, top_k: int | None = None, allocator=None):
    """q rows from logits [..., V]: dense counts, or SparseCounts [..., k] with top_k."""
    w = softmax_weights(logits, temperature)
    if top_k is None:
        return (allocator or allocate)(w)
    ids = topk_support(w, top_k)
    return support_counts(w.gather(-1, ids), ids, w.shape[-1])

