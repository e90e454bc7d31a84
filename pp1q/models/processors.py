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


def processed_probs(logits: torch.Tensor, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """p after processors, float64, same shape as ``logits`` ([..., V]), rows sum to 1."""
    check_processors(temperature, top_k, top_p)
    x = logits.detach().to(torch.float64)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise DistributionError(Reason.UNEXPECTED_SIZE, f"logits shape {tuple(x.shape)}")
    if torch.isnan(x).any():
        raise DistributionError(Reason.NAN_LOGIT, "NaN logit")
    if torch.isposinf(x).any():
        raise DistributionError(Reason.POSINF_LOGIT, "+inf logit")
    if temperature != 1:
        x = x / float(temperature)
    p = torch.softmax(x, dim=-1)
    if not torch.isfinite(p).all():  # every logit -inf, or overflow after / T
        raise DistributionError(Reason.ZERO_MASS, "no finite probability mass")
    vocab = p.shape[-1]
    k = vocab if top_k is None else min(int(top_k), vocab)
    use_p = top_p is not None and float(top_p) < 1.0
    if k == vocab and not use_p:
        return p
    # stable=True is torch's documented guarantee that equal values keep id order,
    # so ties at either boundary resolve to the lowest id on every device.
    order = torch.argsort(p, dim=-1, descending=True, stable=True)
    sorted_p = torch.gather(p, -1, order)
    keep_sorted = torch.zeros_like(sorted_p, dtype=torch.bool)
    keep_sorted[..., :k] = True
    if use_p:
        top = sorted_p * keep_sorted
        top = top / top.sum(dim=-1, keepdim=True)
        # exclusive running sum: the mass strictly before each id (shifted, not
        # cumsum - top, which would round differently from the running sum itself)
        run = torch.cumsum(top, dim=-1)
        before = torch.cat([torch.zeros_like(run[..., :1]), run[..., :-1]], dim=-1)
        keep_sorted &= before < float(top_p)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    out = torch.where(keep, p, torch.zeros_like(p))
    return out / out.sum(dim=-1, keepdim=True)


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
