"""build_row's allocation, on both backends (numpy's passes with the subsample-bounded
k-th largest selection, numba's five-pass kernel pp1q.core.q_scan.allocate), against a
plain sort-based statement of the rule.

tests/core/test_q.py covers small rows; here rows are long enough (>= 4096 entries) for the
subsampled selection, and crafted weights reach the corners: no remainder at all, more
tickets than positive remainders (zero remainders of w > 0 then win, lowest id first),
more tickets than positive entries (refused).
"""

import numpy as np
import pytest
from test_q_backends import BACKENDS, backend

from pp1q.core.errors import DistributionError, Reason
from pp1q.core.q import MASS, _allocate, _kth_largest, build_row


def _plain_counts(logits, temperature=1.0, top_k=None):
    x = np.asarray(logits, dtype=np.float64) / temperature
    w = np.exp(x - x.max())
    w = w / w.sum()
    ids = np.arange(w.size)
    if top_k is not None:
        order = np.lexsort((ids, -w))[:top_k]  # largest first, ties by lowest id
        ids = np.sort(order)
        w = w[ids] / w[ids].sum()
    scaled = w * MASS
    counts = np.floor(scaled).astype(np.int64)
    remaining = MASS - int(counts.sum())
    eligible = np.flatnonzero(w > 0)
    frac = (scaled - np.floor(scaled))[eligible]
    winners = eligible[np.lexsort((eligible, -frac))[:remaining]]
    counts[winners] += 1
    out = np.zeros(len(logits), dtype=np.int64)
    out[ids] = counts
    return out


def _plain_allocation(w):
    scaled = w * MASS
    counts = np.floor(scaled).astype(np.int64)
    remaining = MASS - int(counts.sum())
    eligible = np.flatnonzero(w > 0)
    frac = (scaled - np.floor(scaled))[eligible]
    counts[eligible[np.lexsort((eligible, -frac))[:remaining]]] += 1
    return counts


CRAFTED = {
    "no remainder": [0.5, 0.25, 0.125, 0.125],
    "one ticket": [0.5, 0.25, 0.125, 0.125 - 3e-9, 3e-9],
    "zero remainders win": [0.5, 0.0, 0.25, 0.25 - 2.0 ** -23],  # 2 tickets, none > 0
    "a negative zero": [0.5, -0.0, 0.5],  # a zero weight, as 0.0 is
    "ties by lowest id": [1 / 3, 0.0, 1 / 3, 1 / 3],
}


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_weights_match_the_plain_rule(name, case):
    w = np.array(CRAFTED[case])
    with backend(name):
        assert np.array_equal(_allocate(w.copy()), _plain_allocation(w))


@pytest.mark.parametrize("name", BACKENDS)
def test_more_tickets_than_positive_entries_are_refused(name):
    with backend(name), pytest.raises(DistributionError) as e:
        _allocate(np.array([0.5, 0.0, 0.25]))  # 2^22 tickets for 2 entries
    assert e.value.reason == Reason.ALLOCATION_INCONSISTENT


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("w", [[2.0, -1.0], [float("nan"), 1.0], [1e300, 0.0], [-0.5, 1.5]])
def test_weights_outside_zero_to_one_are_refused(name, w):
    """build_row passes normalised weights only; anything else is refused, never
    converted (the kernel's int32 conversion is meaningless outside [0, 1])."""
    with backend(name), pytest.raises(DistributionError) as e, np.errstate(invalid="ignore"):
        _allocate(np.array(w))
    assert e.value.reason == Reason.ALLOCATION_INCONSISTENT


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("case", range(12))
def test_long_rows_match_the_plain_rule(name, case):
    rng = np.random.default_rng(case)
    vocab = int(rng.integers(4096, 40000))
    x = rng.normal(size=vocab) * rng.uniform(0.5, 8.0)
    if case % 3 == 1:
        x = np.round(x)  # many ties in weights and remainders
    if case % 4 == 2:
        x[rng.random(vocab) < 0.3] = -np.inf
    temperature = [1.0, 0.7, 1.6][case % 3]
    top_k = [None, 32, 3000, None][case % 4]
    with backend(name):
        row = build_row(x, temperature=temperature, top_k=top_k)
    assert np.array_equal(row.dense_counts(), _plain_counts(x, temperature, top_k))


def test_kth_largest_is_exact_including_unlucky_subsamples():
    rng = np.random.default_rng(1)
    for n, r in [(5000, 1), (5000, 5000), (20000, 777), (8192, 4096)]:
        v = rng.random(n)
        assert _kth_largest(v, r) == np.sort(v)[n - r]
    # an adversarial layout: the largest values avoid the subsampled (every 16th) slots
    v = np.zeros(16 * 512)
    v[1::16] = 1.0
    assert _kth_largest(v, 100) == 1.0 and _kth_largest(v, 600) == 0.0
    v = np.full(10000, 0.25)
    assert _kth_largest(v, 9999) == 0.25


def test_bench_q_suite_runs():
    from pp1q.tools.bench import q as bench_q

    lines = bench_q.run(quick=True)
    assert "x softmax" in lines[0]
    names = [line.split("  ")[0] for line in lines[1:]]
    assert any(n.startswith("build_row dense") for n in names)
    assert any(n.startswith("verify_batch") for n in names)
