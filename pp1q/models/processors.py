"""The target's p after its sampling processors: temperature, then top-k, then top-p.

One pure torch function, float64, used by every path that turns target logits into
the p of a round *and* by target-only sampling: if the two paths applied processors
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
differently in the last bits, so p for one request must be computed on one device
(what a verifier rank does). Refusals raise DistributionError like pp1q.q does.

The renormalised top-k row of step 3 is p / S with S the top-k mass summed in id order
(a plain row sum for top-k off), and the running sum runs over the descending order.
Only a prefix of that order is ever needed, so it is never sorted whole: top-k's ids
come from a threshold (torch.topk's k-th value, ties completed lowest id first); top-p
alone sorts only the ids at or above a power of two found by one histogram pass of
mass per binade, checking that their running sum reaches top_p (else every id with
mass). Any value threshold keeps ties whole, so the candidates are a prefix of the
order, and a CPU cumsum is a sequential float64 loop, so their running sums are the
whole row's first ones: the kept set is the one a full stable sort gives
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


_EXP_OFFSET = 1075  # frexp exponents of float64 values > 0 are -1073..1024: bins >= 2
_EXP_BINS = _EXP_OFFSET + 1025


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
    if bool(torch.isnan(top).any()):
        raise DistributionError(Reason.NAN_LOGIT, "NaN logit")
    if bool(torch.isposinf(top).any()):
        raise DistributionError(Reason.POSINF_LOGIT, "+inf logit")
    if temperature != 1:
        x = x / float(temperature)
        top = top / float(temperature)
    if not bool(torch.isfinite(top).all()):  # every logit -inf, or overflow after / T
        raise DistributionError(Reason.ZERO_MASS, "no finite probability mass")
    p = torch.softmax(x, dim=-1)
    vocab = p.shape[-1]
    k = vocab if top_k is None else min(int(top_k), vocab)
    use_p = top_p is not None and float(top_p) < 1.0
    if k == vocab and not use_p:
        return p
    rows = p.reshape(-1, vocab)
    keep = torch.zeros_like(rows, dtype=torch.bool)
    for r in range(rows.shape[0]):
        keep[r, _kept(rows[r], k, float(top_p) if use_p else None)] = True
    out = torch.where(keep.view(p.shape), p, torch.zeros_like(p))
    return out / out.sum(dim=-1, keepdim=True)


def _descending(ids: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """Ascending ``ids`` reordered by descending ``row`` value, equal values keeping id
    order (stable=True is torch's documented guarantee of that, on every device)."""
    return ids[torch.argsort(row[ids], descending=True, stable=True)]


def _largest(row: torch.Tensor, n: int) -> torch.Tensor:
    """Ids of the n largest entries of ``row`` in descending order, ties lowest id first:
    the first n of a full stable descending sort, without sorting the rest."""
    if n >= row.numel():
        return torch.argsort(row, descending=True, stable=True)
    nth = torch.topk(row, n, sorted=False).values.min()  # the n-th largest value
    above = (row > nth).nonzero().squeeze(-1)  # ascending ids
    tied = (row == nth).nonzero().squeeze(-1)[: n - above.numel()]  # the lowest ids win
    return _descending(torch.cat([above, tied]), row)  # ties sit in ascending id order


def _prefix(ids: torch.Tensor, row: torch.Tensor, total: torch.Tensor, top_p: float,
            complete: bool) -> torch.Tensor | None:
    """The kept part of candidates ``ids`` (a prefix of the descending order), or None
    when they may end too early: unless ``complete``, the first id left out must have
    mass >= top_p before it, i.e. the candidates' inclusive running sum reaches top_p."""
    # the renormalised prefix's running sum; the mass strictly before an id is the sum
    # before it (shifted, not run - top: that would round differently from run itself)
    run = torch.cumsum(row[ids] / total, dim=0)
    if not complete and float(run[-1]) < top_p:
        return None
    return ids[torch.cat([run.new_zeros(1), run[:-1]]) < top_p]


def _kept(row: torch.Tensor, k: int, top_p: float | None) -> torch.Tensor:
    """Ids one row keeps: its top k, then (top_p) the descending prefix whose mass
    strictly before each kept id is < top_p (zero-probability ids may be left out:
    they add nothing to p either way)."""
    if top_p is None:
        return _largest(row, k)
    if k < row.numel():
        ids = _largest(row, k)
        in_k = torch.zeros_like(row, dtype=torch.bool)
        in_k[ids] = True
        total = torch.where(in_k, row, torch.zeros_like(row)).sum()  # id order
        return _prefix(ids, row, total, top_p, complete=True)
    total = row.sum()
    # candidates: every entry at or above the lower bound of the binade (power-of-two
    # interval) where the mass counted from the top first reaches top_p, one pass to
    # find it; a value threshold keeps ties whole, so they are a prefix of the order
    _, exponent = torch.frexp(row)
    mass = torch.bincount(exponent.to(torch.int64) + _EXP_OFFSET, weights=row,
                          minlength=_EXP_BINS)
    reach = int(torch.searchsorted(mass.flip(0).cumsum(0), top_p * float(total)))
    if reach < _EXP_BINS:
        bound = math.ldexp(0.5, _EXP_BINS - 1 - reach - _EXP_OFFSET)
        kept = _prefix(_descending((row >= bound).nonzero().squeeze(-1), row), row, total,
                       top_p, complete=False)
        if kept is not None:
            return kept
    # the binned mass rounded past top_p where the running sum does not: every id with
    # mass (exact, slower, rare)
    return _prefix(_descending((row > 0).nonzero().squeeze(-1), row), row, total, top_p,
                   complete=True)


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
