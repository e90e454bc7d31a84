"""The target's p after its sampling processors: temperature, then top-k, then top-p.

One pure torch function, float64, used by every whole-row path that turns target
logits into the p of a round (one process, replicated ranks, EngineDecider) *and* by
target-only sampling; vocabulary-sharded ranks apply the same rules in exact integers
(pp1q_kernels.shard_processors): if the two paths applied processors
differently (or only one of them did), speculative output would no longer be
distributed as target-only output, and nothing downstream could notice.

Order and rules (the order HF generation and vLLM use):
  1. temperature T > 0: softmax(logits / T) in float64 (T = 1 divides by nothing);
  2. top-k: keep the k largest probabilities; ties at the boundary go to the lowest
     id, the same tie rule as the drafter's q (pp1q.q.build_row), so the kept set is
     always exactly k ids and never depends on sort stability of the device;
  3. top-p: over the renormalised top-k row, keep the smallest prefix of the
     descending order (ties: lowest id first) whose mass reaches top_p, i.e. keep id j
     when the mass strictly before it is < top_p. top_p = 1 keeps everything (the
     cumulative sum may round to just under 1, so it is skipped rather than computed).
The result is renormalised to sum to 1 (float64) with exact zeros outside the kept set.

Boundary decisions come from a float64 cumulative sum; two devices may round it
differently in the last bits, so this function's p for one request must be computed
on one device (what a verifier rank does). Refusals raise DistributionError like pp1q.q does.

The renormalised top-k row of step 3 is p / S with S the top-k mass summed in id order
(a plain row sum for top-k off), and the running sum runs over the descending order.
Only a prefix of that order is ever needed, so it is never sorted whole: top-k's ids
come from a threshold (torch.topk's k-th value, ties completed lowest id first); top-p
alone sorts only the ids at or above a power of two found by one histogram pass of
mass per binade, checking that their running sum reaches top_p (else every id with
mass). Any value threshold keeps ties whole, so the candidates are a prefix of the
order, and their running sum is taken on the host, where a cumsum is a sequential
float64 loop (on any device: a GPU's scan may round otherwise, run to run), so their
running sums are the whole row's first ones: the kept set is the one a full stable sort gives
(tests/models/test_processors.py compares the two). At V = 49152 the full sort of a
round's six rows took 23 ms of a ~100 ms round on one core.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from pp1q.core.errors import DistributionError, Reason


def check_processors(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Refuse settings target-only sampling could not apply either."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise DistributionError(Reason.BAD_TEMPERATURE, f"temperature {temperature!r}")
    if not math.isfinite(temperature) or temperature <= 0:
        raise DistributionError(Reason.BAD_TEMPERATURE, f"temperature {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or top_k < 1):
        raise DistributionError(Reason.BAD_TOP_K, f"top_k {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                              or not 0.0 < float(top_p) <= 1.0):
        raise DistributionError(Reason.BAD_TOP_P, f"top_p {top_p!r}")


_EXP_SHIFT = 52  # a float64's biased exponent sits above its 52 mantissa bits
_EXP_BINS = 2048  # 11 exponent bits: one bin per binade; bin 0 holds zeros and subnormals
_TINY = math.ulp(0.0)  # the least float64 > 0: "at least this" is "has mass"


def processed_probs(logits: torch.Tensor, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """p after processors, float64, same shape as ``logits`` ([..., V]), rows sum to 1."""
    check_processors(temperature, top_k, top_p)
    x = logits.detach().to(torch.float64)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise DistributionError(Reason.UNEXPECTED_SIZE, f"logits shape {tuple(x.shape)}")
    # the refusals ride on the row maxima (one pass): NaN propagates through the max,
    # +inf is the max; max(x / T) = max(x) / T (a correctly rounded division by T > 0
    # is monotone), so an overflow to +inf or an all -inf row shows there too
    top = x.amax(dim=-1)
    flags = [torch.isnan(top).any(), torch.isposinf(top).any()]
    if temperature != 1:
        x = x / float(temperature)
        top = top / float(temperature)
    flags.append(~torch.isfinite(top).all())  # every logit -inf, or overflow after / T
    # the three refusals' flags in one read (one sync on a GPU), raised in this order
    nan, posinf, no_mass = torch.stack(flags).tolist()
    if nan:
        raise DistributionError(Reason.NAN_LOGIT, "NaN logit")
    if posinf:
        raise DistributionError(Reason.POSINF_LOGIT, "+inf logit")
    if no_mass:
        raise DistributionError(Reason.ZERO_MASS, "no finite probability mass")
    p = torch.softmax(x, dim=-1)
    vocab = p.shape[-1]
    k = vocab if top_k is None else min(int(top_k), vocab)
    use_p = top_p is not None and float(top_p) < 1.0
    if (k == vocab and not use_p) or not p.numel():  # nothing to keep from no rows
        return p
    rows = p.reshape(-1, vocab)
    keep = _top_k(rows, k) if k < vocab else None
    if not use_p:
        kept = keep.nonzero(as_tuple=True)
    elif keep is not None:
        total = torch.where(keep, rows, torch.zeros_like(rows)).sum(-1)  # id order
        kept = _nucleus(rows, keep, total, float(top_p), complete=True)
    else:
        total = rows.sum(-1)
        kept = _nucleus(rows, _binade_candidates(rows, total, float(top_p)), total,
                        float(top_p), complete=False)
    # p on the kept ids, exact zeros elsewhere (built from the few kept ids: a masked
    # select over the whole row, torch.where, cost ~2 ms for six rows here)
    out = torch.zeros_like(rows)
    out[kept] = rows[kept]
    return out.div_(out.sum(dim=-1, keepdim=True)).view(p.shape)


def _top_k(rows: torch.Tensor, k: int) -> torch.Tensor:
    """Mask of each row's k largest entries, ties at the boundary lowest id first."""
    nth = torch.topk(rows, k, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    above = rows > nth
    tied = rows == nth
    room = k - above.sum(-1, keepdim=True)
    return above | (tied & (tied.cumsum(-1) <= room))


def _binade_candidates(rows: torch.Tensor, total: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask of the entries at or above the lower end of the binade (power-of-two interval)
    where each row's mass counted from the top first reaches top_p * total: one
    histogram pass, no sort. Only an estimate (its sums round in any order): _nucleus
    checks that the candidates' running sum does reach top_p."""
    binade = rows.view(torch.int64) >> _EXP_SHIFT  # p >= 0: the sign bit is 0
    mass = torch.zeros(rows.shape[0], _EXP_BINS, dtype=rows.dtype, device=rows.device)
    mass.scatter_add_(-1, binade, rows)
    reach = torch.searchsorted(mass.flip(-1).cumsum(-1), (top_p * total).unsqueeze(-1))
    lowest = (_EXP_BINS - 1 - reach).clamp(min=0)  # 0 when never reached: every id
    bound = (lowest << _EXP_SHIFT).view(torch.float64)  # 2^(E - 1023); 0.0 for bin 0
    return rows >= bound.clamp(min=_TINY)  # bin 0: every id with mass


def _nucleus(rows: torch.Tensor, candidates: torch.Tensor, total: torch.Tensor, top_p: float,
             complete: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, ids) kept: per row, the prefix of its candidates (a value threshold or the
    top k: a prefix of the descending order, ties whole) in descending order, ties
    lowest id first, whose mass strictly before each id is < top_p."""
    r, ids = candidates.nonzero(as_tuple=True)  # row by row, ids ascending
    # stable=True is torch's documented guarantee that equal values keep their order,
    # on every device: by value within rows (ties stay in id order), then by row
    order = torch.argsort(rows[r, ids], descending=True, stable=True)
    order = order[torch.argsort(r[order], stable=True)]
    r, ids = r[order], ids[order]
    # every candidate's row and share of its row's mass, read to the host at once (one
    # wait on a GPU for all rows, not one a row; a row index is exact in float64)
    host_r, share = torch.stack([r.to(torch.float64), rows[r, ids] / total[r]]).cpu()
    counts = torch.bincount(host_r.long(), minlength=rows.shape[0]).tolist()
    kept_rows, kept_ids = [], []
    start = 0
    for row, m in enumerate(counts):
        n = _prefix_length(share[start:start + m], top_p, complete)
        if n is not None:
            kept = ids[start:start + n]
        else:  # the binned mass rounded past top_p: every id with mass (rare)
            every = (rows[row] > 0).nonzero().squeeze(-1)
            every = every[torch.argsort(rows[row][every], descending=True, stable=True)]
            kept = every[:_prefix_length((rows[row][every] / total[row]).cpu(), top_p, True)]
        kept_rows.append(torch.full_like(kept, row))
        kept_ids.append(kept)
        start += m
    return torch.cat(kept_rows), torch.cat(kept_ids)


def _prefix_length(share: torch.Tensor, top_p: float, complete: bool) -> int | None:
    """How many of a row's candidates are kept, given their shares of the row's mass in
    descending order (a host tensor); None when they may end too early: unless
    ``complete``, the first id left out must have mass >= top_p before it, i.e. the
    candidates' inclusive running sum reaches top_p."""
    if not share.numel():
        return None if not complete else 0
    # the renormalised prefix's running sum; the mass strictly before an id is the sum
    # before it (shifted, not run - top: that would round differently from run itself).
    # On the host whatever the device: a CPU cumsum is one sequential float64 loop, a
    # GPU's a parallel scan that may round otherwise, and not the same way every run.
    # The shares are >= 0, so the running sum never falls: the ids kept are a prefix.
    run = torch.cumsum(share, dim=0)
    if not complete and float(run[-1]) < top_p:
        return None
    return int((torch.cat([run.new_zeros(1), run[:-1]]) < top_p).sum())


DEFAULT_CONTEXT_VERSION = 0  # T = 1, no top-k, no top-p: what every STEP carried before


@dataclass(frozen=True)
class Processors:
    """One request's target processors: what target-only sampling applies to p, and
    therefore what every round's p must have applied too (one function for both)."""

    temperature: float = 1.0
    top_k: int | None = None  # normalised: None when k >= vocab (keeps every id)
    top_p: float | None = None  # normalised: None when top_p == 1

    def __post_init__(self) -> None:
        check_processors(self.temperature, self.top_k, self.top_p)

    @property
    def is_default(self) -> bool:
        return self.temperature == 1 and self.top_k is None and self.top_p is None

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return processed_probs(logits, self.temperature, self.top_k, self.top_p)

    @property
    def context_version(self) -> int:
        """STEP's u32 context version naming this processor set: 0 for the default set,
        else a digest of the exact values (never 0), so two sets never share a version
        by accident and a STEP says which p its round is verified against."""
        if self.is_default:
            return DEFAULT_CONTEXT_VERSION
        text = (f"pp1q-processors-v1:{float(self.temperature).hex()}:{self.top_k}:"
                f"{None if self.top_p is None else float(self.top_p).hex()}")
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") or 1


def normalised(temperature: float, top_k: int | None, top_p: float | None,
               vocab: int) -> Processors:
    """Processors with no-op settings dropped (k >= vocab, top_p = 1), so equal
    sampling rules get equal context versions."""
    if top_k is not None and not isinstance(top_k, bool) and isinstance(top_k, int) \
            and top_k >= vocab:
        top_k = None
    if top_p is not None and not isinstance(top_p, bool) and top_p == 1:
        top_p = None
    return Processors(temperature, top_k, top_p)
