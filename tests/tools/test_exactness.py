"""The demo's statistics: the chi-square p-value matches scipy's, the homogeneity test
separates equal from different distributions, the ratio interval covers its truth."""

import numpy as np
import pytest

from pp1q.tools.exactness import agreement, bars, chi2_sf, homogeneity, ratio_interval


def test_chi2_sf_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for x, df in [(0.5, 1), (3.0, 2), (12.0, 7), (40.0, 20), (200.0, 150)]:
        assert chi2_sf(x, df) == pytest.approx(stats.chi2.sf(x, df), rel=1e-9)


def test_homogeneity_accepts_equal_and_rejects_different_laws():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(30))
    a, b = rng.choice(30, 4000, p=p).tolist(), rng.choice(30, 4000, p=p).tolist()
    same = homogeneity(a, b)
    assert same.p_value > 1e-3 and same.df >= 10
    q = p.copy()
    hi, lo = int(p.argmax()), int(p.argmin())
    q[hi], q[lo] = p[lo], p[hi]  # the largest and smallest masses swapped
    diff = homogeneity(a, rng.choice(30, 4000, p=q).tolist())
    assert diff.p_value < 1e-6
    assert sum(same.a) == 4000 and sum(same.b) == 4000  # pooling loses no sample
    lines = bars(same, ("speculative", "target-only"))
    assert len(lines) == 1 + 10 + (same.bins[-1] is None) and "%" in lines[1]


def test_ratio_interval_covers_the_truth_about_95_percent():
    rng = np.random.default_rng(1)
    covered = 0
    for _ in range(400):
        rounds = rng.integers(5, 15, size=16)
        accepted = [int(rng.binomial(5 * n, 0.3)) for n in rounds]  # truth: 1.5 per round
        r, se = ratio_interval(accepted, rounds.tolist())
        covered += agreement(r, se, 1.5, 0.0)[2]
    assert 0.88 <= covered / 400 <= 0.99
