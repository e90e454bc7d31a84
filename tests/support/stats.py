"""Shared chi-square goodness-of-fit helper for the statistical tests.

Convention (every statistical test here): fixed seeds, threshold = the chi-square
quantile at ALPHA = 1e-6 for the test's degrees of freedom, bins with expected count
< 5 merged (smallest first) into one pooled bin, and a planted-bug variant that the
same check must reject. An observation in a zero-probability bin is an outright
failure (statistic = inf): no amount of sampling noise explains it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

ALPHA = 1e-6
MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class ChiSquare:
    stat: float
    df: int
    threshold: float
    n: int

    @property
    def rejected(self) -> bool:
        return not self.stat <= self.threshold

    def __str__(self) -> str:
        return f"chi2 {self.stat:.1f} (df {self.df}, threshold {self.threshold:.1f}, n {self.n})"


def threshold(df: int, alpha: float = ALPHA) -> float:
    return float(stats.chi2.isf(alpha, df))


def chi_square(observed, probs, alpha: float = ALPHA) -> ChiSquare:
    """Pearson chi-square of observed counts against probabilities (normalised here)."""
    obs = np.asarray(observed, dtype=np.float64)
    pr = np.asarray(probs, dtype=np.float64)
    if obs.shape != pr.shape or obs.ndim != 1:
        raise ValueError("observed and probs must be 1-D and the same length")
    n = int(obs.sum())
    pr = pr / pr.sum()
    if n == 0:
        return ChiSquare(0.0, 0, np.inf, 0)
    if obs[pr == 0].sum() > 0:
        return ChiSquare(np.inf, 0, threshold(1, alpha), n)
    obs, exp = obs[pr > 0], pr[pr > 0] * n
    order = np.argsort(exp, kind="stable")
    obs, exp = obs[order], exp[order]
    # pool the smallest bins until the pool reaches MIN_EXPECTED (and so every bin does)
    k = 0
    while k < exp.size and exp[: k + 1].sum() < MIN_EXPECTED:
        k += 1
    if k:
        k = min(k + 1, exp.size)  # the pool itself must reach MIN_EXPECTED
        obs = np.concatenate([[obs[:k].sum()], obs[k:]])
        exp = np.concatenate([[exp[:k].sum()], exp[k:]])
    df = exp.size - 1
    if df < 1:
        return ChiSquare(0.0, 0, np.inf, n)
    stat = float(((obs - exp) ** 2 / exp).sum())
    return ChiSquare(stat, df, threshold(df, alpha), n)


def assert_fits(observed, probs, label: str = "") -> ChiSquare:
    r = chi_square(observed, probs)
    assert not r.rejected, f"{label}: {r}"
    return r
