"""The goodness-of-fit judge shared by the statistical tests.

Convention (every statistical test here): fixed seeds; the likelihood-ratio statistic
G = 2 * sum(O * ln(O / E)) over bins of expected count >= MIN_EXPECTED (smaller bins
merged, smallest first, into one pooled bin); threshold = the chi-square quantile at
QUANTILE_ALPHA for the degrees of freedom; a planted-bug variant that the same check must
reject. An observation in a zero-probability bin is an outright failure (statistic =
inf): no amount of sampling noise explains it.

Why G, and why the quantile sits below ALPHA: a check's threshold lies about five
standard deviations out, where a bin of 5-20 expected counts is visibly skewed (Poisson),
and the chi-square approximation of the statistic's tail is not what it says there.
Measured at the daemon experiment's marginals (1,000 draws over vocabulary 16,
tests/core/test_stats_calibration.py), Pearson's statistic at its 1e-6 quantile raised
false alarms 5-33 times as often as 1e-6; G raised them 1.1-2 times as often, and at the
1e-7 quantile at most 2.5e-7 of the time. So a check here stays under ALPHA.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.special import xlogy

ALPHA = 1e-6  # the false-alarm rate a check may have (what the tests state)
# the quantile thresholds are read at: G's tail runs up to twice its approximation here
QUANTILE_ALPHA = ALPHA / 10
MIN_EXPECTED = 5.0  # the usual validity rule for a bin; smaller ones are pooled


@dataclass(frozen=True)
class FitTest:
    """One goodness-of-fit check: G, its degrees of freedom and threshold, draws judged."""

    stat: float
    df: int
    threshold: float
    n: int

    @property
    def rejected(self) -> bool:
        return not self.stat <= self.threshold

    def __str__(self) -> str:
        return f"G {self.stat:.1f} (df {self.df}, threshold {self.threshold:.1f}, n {self.n})"


def threshold(df: int, alpha: float = QUANTILE_ALPHA) -> float:
    return float(stats.chi2.isf(alpha, df))


@dataclass(frozen=True)
class Bins:
    """How counts over the support (probability > 0) are pooled: ``order`` sorts them by
    expected count, the first ``pooled`` of that order form one bin; ``expected`` per bin."""

    support: np.ndarray  # bool [K]
    order: np.ndarray
    pooled: int
    expected: np.ndarray

    def apply(self, observed: np.ndarray) -> np.ndarray:
        """Counts [..., K] -> counts per bin [..., len(expected)]."""
        obs = observed[..., self.support][..., self.order]
        if not self.pooled:
            return obs
        return np.concatenate([obs[..., : self.pooled].sum(axis=-1, keepdims=True),
                               obs[..., self.pooled:]], axis=-1)


def bins(probs, n: int) -> Bins:
    """Pool the smallest bins of ``probs`` (normalised here) for ``n`` draws until the pool
    reaches MIN_EXPECTED (and so every bin does)."""
    pr = np.asarray(probs, dtype=np.float64)
    pr = pr / pr.sum()
    support = pr > 0
    exp = pr[support] * n
    order = np.argsort(exp, kind="stable")
    exp = exp[order]
    k = 0
    while k < exp.size and exp[: k + 1].sum() < MIN_EXPECTED:
        k += 1
    if k:
        k = min(k + 1, exp.size)  # the pool itself must reach MIN_EXPECTED
        exp = np.concatenate([[exp[:k].sum()], exp[k:]])
    return Bins(support, order, k, exp)


def g_statistic(observed: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """G over the last axis of binned counts (0 * ln 0 = 0)."""
    obs = np.asarray(observed, dtype=np.float64)
    return 2.0 * xlogy(obs, obs / expected).sum(axis=-1)


def g_test(observed, probs, alpha: float = QUANTILE_ALPHA) -> FitTest:
    """G of observed counts against probabilities (normalised here)."""
    obs = np.asarray(observed, dtype=np.float64)
    pr = np.asarray(probs, dtype=np.float64)
    if obs.shape != pr.shape or obs.ndim != 1:
        raise ValueError("observed and probs must be 1-D and the same length")
    n = int(obs.sum())
    if n == 0:
        return FitTest(0.0, 0, np.inf, 0)
    if obs[pr == 0].sum() > 0:
        return FitTest(np.inf, 0, threshold(1, alpha), n)
    b = bins(pr, n)
    df = b.expected.size - 1
    if df < 1:
        return FitTest(0.0, 0, np.inf, n)
    return FitTest(float(g_statistic(b.apply(obs), b.expected)), df, threshold(df, alpha), n)

