"""Kernels 1 and 2: global softmax weights, dyadic24 counts, top-k support."""

from fractions import Fraction

import numpy as np
import pytest
import torch

from pp1q.core.errors import DistributionError, Reason
from pp1q.core.q import MASS, build_row
from pp1q_kernels import counts, topk
from pp1q_kernels.lookup import dense_counts, to_rows

INF = float("inf")


def logit_rows(g, n, vocab):
    """Random rows plus the awkward ones: uniform (all ties), masked, one dominant."""
    x = g.normal(0.0, 3.0, (n, vocab))
    x[0] = 0.0
    if vocab > 2:
        x[1, 1:-1] = -INF
        x[2, vocab // 2] = 80.0
    return torch.tensor(x)


@pytest.mark.parametrize("vocab", [1, 2, 7, 257, 5000])
@pytest.mark.parametrize("temperature", [1.0, 0.35, 2.5])
def test_dense_counts_equal_build_row(vocab, temperature):
    g = np.random.default_rng(vocab)
    x = logit_rows(g, 6, vocab)
    got = counts.build_counts(x, temperature)
    for r in range(x.shape[0]):
        want = build_row(x[r].numpy(), temperature=temperature).dense_counts()
        assert np.array_equal(got[r].numpy(), want)


@pytest.mark.parametrize("vocab,k", [(7, 1), (7, 3), (7, 7), (7, 50), (257, 32), (5000, 64)])
def test_topk_counts_equal_build_row(vocab, k):
    g = np.random.default_rng(vocab + k)
    x = logit_rows(g, 6, vocab)
    got = to_rows(counts.build_counts(x, 0.7, top_k=k))
    assert got == [build_row(x[r].numpy(), temperature=0.7, top_k=k) for r in range(6)]


def test_full_deepseek_vocabulary_rows_equal_build_row():
    g = np.random.default_rng(129280)
    x = torch.tensor(g.normal(0.0, 2.0, (2, 129280)))
    got = counts.build_counts(x)  # the histogram path of the remainder threshold
    for r in range(2):
        assert np.array_equal(got[r].numpy(), build_row(x[r].numpy()).dense_counts())


def fraction_allocation(w):
    """The seed's rule in exact rationals: floor(w M), then largest remainders, lowest id."""
    scaled = [Fraction(float(v)) * MASS for v in w]
    base = [int(s) for s in scaled]
    remaining = MASS - sum(base)
    order = sorted((i for i, v in enumerate(w) if v > 0), key=lambda i: (-(scaled[i] - base[i]), i))
    for i in order[:remaining]:
        base[i] += 1
    return base


def test_allocation_equals_the_exact_rule_on_given_weights():
    g = np.random.default_rng(8)
    for vocab in (3, 40, 900):
        raw = g.exponential(1.0, (5, vocab)) * (g.random((5, vocab)) < 0.7)
        raw[0] = 1.0  # exact ties of every remainder
        w = torch.tensor(raw / raw.sum(-1, keepdims=True))
        got = counts.allocate(w)
        for r in range(5):
            assert got[r].tolist() == fraction_allocation(w[r].tolist())


def test_threshold_search_histogram_equals_sort_on_adversarial_keys():
    g = np.random.default_rng(9)
    n = 9000
    key = torch.tensor(g.random((7, n)))
    key[0] = 0.5  # one crowded bin
    key[1, ::2] = -1.0  # half ineligible
    key[2] = torch.tensor(g.random(n) * 1e-9)  # every key in bin 0
    key[3, :10] = torch.tensor([0.25] * 10)
    key[4] = torch.tensor(np.repeat(g.random(30), 300))
    k = torch.tensor([1, 4500, 3, n, 17, 8000, 9])
    assert torch.equal(counts.kth_largest(key, k, "sort"), counts.kth_largest(key, k, "hist"))


@pytest.mark.parametrize("logits,temperature,reason", [
    ([0.0, float("nan")], 1.0, Reason.NAN_LOGIT),
    ([0.0, INF], 1.0, Reason.POSINF_LOGIT),
    ([-INF, -INF], 1.0, Reason.ZERO_MASS),
    ([0.0, 1.0], 0.0, Reason.BAD_TEMPERATURE),
    ([0.0, 1.0], -1.0, Reason.BAD_TEMPERATURE),
    ([0.0, 1.0], float("nan"), Reason.BAD_TEMPERATURE),
    ([0.0, 1e308], 1e-10, Reason.BAD_TEMPERATURE),
])
def test_refusals_match_build_row(logits, temperature, reason):
    with pytest.raises(DistributionError) as ours:
        counts.build_counts(torch.tensor([logits], dtype=torch.float64), temperature)
    with pytest.raises(DistributionError) as core:
        build_row(np.array(logits), temperature=temperature)
    assert ours.value.reason == core.value.reason == reason


def test_unnormalised_weights_are_refused_not_clipped():
    with pytest.raises(DistributionError) as e:
        counts.allocate(torch.tensor([[0.7, 0.7]], dtype=torch.float64))
    assert e.value.reason == Reason.ALLOCATION_INCONSISTENT


def test_per_row_temperature_and_logsumexp():
    g = np.random.default_rng(10)
    x = torch.tensor(g.normal(0, 2, (3, 50)))
    t = torch.tensor([0.5, 1.0, 3.0])
    got = counts.build_counts(x, t)
    for r in range(3):
        assert np.array_equal(got[r].numpy(), build_row(x[r].numpy(), temperature=float(t[r]))
                              .dense_counts())
    lse = counts.logsumexp(x, t)
    assert torch.allclose(lse, torch.logsumexp(x / t[:, None], -1), rtol=0, atol=1e-12)


def test_topk_support_ties_lowest_id_and_merge_is_exact():
    w = torch.tensor([[0.1, 0.2, 0.2, 0.2, 0.1, 0.2]], dtype=torch.float64)
    assert topk.topk_support(w, 2).tolist() == [[1, 2]]
    assert topk.topk_support(w, 5).tolist() == [[0, 1, 2, 3, 5]]
    g = np.random.default_rng(11)
    w = torch.tensor(g.integers(0, 5, (20, 60)) / 10.0)  # many exact ties
    for k in (1, 7, 60):
        cuts = [0, 13, 14, 41, 60]
        cands = [topk.local_topk(w[:, a:b], k, a) for a, b in zip(cuts, cuts[1:], strict=False)]
        merged = topk.merge_topk([v for v, _ in cands], [i for _, i in cands], k)
        assert torch.equal(merged, topk.topk_support(w, k))


def test_counts_are_dense_and_sum_to_mass_with_masked_ids_zero():
    x = torch.tensor([[0.0, -INF, 1.0, -INF]], dtype=torch.float64)
    c = counts.build_counts(x)
    assert int(c.sum()) == MASS and c[0, 1] == 0 and c[0, 3] == 0
    assert torch.equal(dense_counts(counts.build_counts(x, top_k=4)), c)
