"""The demo's evidence, as pure functions: do speculative and target-only samples of one
context come from the same distribution (chi-square test of homogeneity, terminal bars),
and is the measured accepted length what theory expects, within both noises?"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MIN_EXPECTED = 5.0  # chi-square's usual validity rule: pool tokens expected fewer times
Z95 = 1.959964  # two-sided 95% normal quantile


@dataclass(frozen=True)
class Homogeneity:
    """Two samples binned alike: ``bins`` (token id, or None for the pooled rest) with
    each sample's counts, the chi-square statistic, its degrees of freedom, p-value."""

    bins: list[int | None]
    a: list[int]
    b: list[int]
    chi2: float
    df: int
    p_value: float


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square(df) (the regularized upper incomplete gamma)."""
    import torch

    if df <= 0:
        return float("nan")
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(x / 2, dtype=torch.float64)))


def homogeneity(a: Sequence[int], b: Sequence[int]) -> Homogeneity:
    """Chi-square test that samples ``a`` and ``b`` (token ids) share one distribution.
    Tokens whose expected count in either sample is under MIN_EXPECTED are pooled."""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    n = na + nb
    pooled = ca + cb
    frac = min(na, nb) / n
    kept = sorted((t for t, c in pooled.items() if c * frac >= MIN_EXPECTED),
                  key=lambda t: (-pooled[t], t))
    bins: list[int | None] = list(kept)
    xa = [ca[t] for t in kept]
    xb = [cb[t] for t in kept]
    rest_a, rest_b = na - sum(xa), nb - sum(xb)
    if rest_a + rest_b > 0:
        bins.append(None)
        xa.append(rest_a)
        xb.append(rest_b)
    chi2 = 0.0
    for oa, ob in zip(xa, xb, strict=True):
        tot = oa + ob
        for obs, size in ((oa, na), (ob, nb)):
            exp = tot * size / n
            if exp > 0:
                chi2 += (obs - exp) ** 2 / exp
    df = len(bins) - 1
    return Homogeneity(bins, xa, xb, chi2, df, chi2_sf(chi2, df))


def bars(h: Homogeneity, labels: tuple[str, str], *, rows: int = 10, width: int = 30,
         name=str) -> list[str]:
    """Side-by-side frequency bars of the most frequent bins (terminal text);
    ``name(token)`` labels a bin (a real model's token text, say)."""
    na, nb = sum(h.a), sum(h.b)
    top = max(max(h.a) / na, max(h.b) / nb) if na and nb else 1.0
    out = [f"  {'token':>12}  {labels[0]:<{width + 7}}  {labels[1]}"]
    for t, oa, ob in list(zip(h.bins, h.a, h.b, strict=True))[:rows] + (
            [(h.bins[-1], h.a[-1], h.b[-1])] if len(h.bins) > rows and h.bins[-1] is None
            else []):
        fa, fb = oa / na, ob / nb
        label = "other" if t is None else name(t)
        out.append(f"  {label:>12}  {'#' * round(width * fa / top):<{width}} {fa:5.1%}  "
                   f"{'#' * round(width * fb / top):<{width}} {fb:5.1%}")
    return out


def ratio_interval(accepted: Sequence[int], rounds: Sequence[int]) -> tuple[float, float]:
    """(sum accepted / sum rounds, its standard error) over requests: the ratio estimator,
    with requests (not rounds, which are correlated within one) as the independent units."""
    k = len(rounds)
    total = sum(rounds)
    if k < 2 or total == 0:
        return (sum(accepted) / total if total else float("nan")), float("nan")
    r = sum(accepted) / total
    mean_rounds = total / k
    resid = sum((a - r * n) ** 2 for a, n in zip(accepted, rounds, strict=True))
    return r, math.sqrt(resid / (k * (k - 1))) / mean_rounds


def agreement(measured: float, se_measured: float, expected: float, se_expected: float):
    """(difference, its 95% half-width, consistent?) with both standard errors combined."""
    half = Z95 * math.hypot(se_measured, se_expected)
    diff = measured - expected
    return diff, half, abs(diff) <= half
