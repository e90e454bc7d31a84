"""build_counts' CPU forms (numba, where pp1q.core.q_backend chooses it) against the torch
forms they replace: the exact total's limbs, the allocation a row at a time, the top-k
positions. Each must give the same integers, ties and refusals included; the torch forms
stay the reference (and run wherever numba does not)."""

import numpy as np
import pytest
import torch

pytest.importorskip("numba")

from pp1q.core import q_backend  # noqa: E402
from pp1q.core.errors import DistributionError, Reason  # noqa: E402
from pp1q.core.q import MASS  # noqa: E402
from pp1q_kernels import counts, dispatch, fixed, numba_counts, topk  # noqa: E402


@pytest.fixture
def numba_rows():
    """q_backend's choice set to numba (build_counts' CPU forms), restored after."""
    before = q_backend.select("numba")
    yield q_backend.kernels()
    q_backend.select(before)


def torch_forms(fn):
    """``fn()`` with q_backend's choice set to numpy: every counts/topk form is torch's."""
    before = q_backend.select("numpy")
    try:
        return fn()
    finally:
        q_backend.select(before)


def weight_rows(g, n, vocab):
    """Normalised FP64 rows: random, with zeros, all ties, one dominant entry."""
    raw = g.exponential(1.0, (n, vocab)) * (g.random((n, vocab)) < 0.6)
    raw[:, 0] += 1e-3  # every row has mass
    raw[1] = 1.0  # every remainder tied
    raw[2, 1:] = 0.0  # one entry holds it all
    raw[3] = np.exp(g.normal(0.0, 4.0, vocab))  # a softmax-like spread: mostly tiny
    return torch.tensor(raw / raw.sum(-1, keepdims=True))


def test_limbs_equal_the_torch_limbs():
    g = np.random.default_rng(1)
    rows = torch.tensor(g.random((6, 3001)))
    rows[0, :6] = torch.tensor([0.0, 1.0, 2.0**-1074, 2.0**-90, 1 - 2.0**-53, 2.0**-45])
    rows[1] = 1.0  # the largest sums the limbs hold
    rows[2] = torch.softmax(torch.tensor(g.normal(0, 4, 3001)), -1)
    rows[3] *= 2.0**-40  # bits below 2^-90: the low limb's floor drops them
    hi, lo = np.empty(6, np.int64), np.empty(6, np.int64)
    numba_counts.sum_limbs(rows.numpy(), hi, lo)
    want_hi, want_lo = fixed.sum_limbs(rows)
    assert hi.tolist() == want_hi.tolist() and lo.tolist() == want_lo.tolist()


def test_exact_total_equals_the_torch_form(numba_rows):
    """softmax_weights' total from the numba limbs, on the very weights torch's form sums
    (two torch.exp calls are not compared: see the note in docs/kernels.md)."""
    g = np.random.default_rng(2)
    x = torch.tensor(g.normal(0.0, 3.0, (5, 4099)))
    x[1, 7:] = -float("inf")
    xs, gmax = counts.scaled_logits(x, 0.7)
    e = torch.exp(xs - gmax)
    got = counts._exact_total(e)
    assert torch.equal(got, fixed.exact_sum(e))
    assert torch.equal(got, torch_forms(lambda: counts._exact_total(e)))


@pytest.mark.parametrize("vocab", [1, 3, 40, 5000, 129280])
def test_allocate_rows_equal_torch_allocate(numba_rows, vocab):
    g = np.random.default_rng(vocab)
    w = weight_rows(g, 4, vocab) if vocab > 1 else torch.ones(2, 1, dtype=torch.float64)
    kept = w.clone()
    got = counts.allocate_rows(numba_rows, w)
    assert torch.equal(w, kept)  # not consumed unless asked
    assert got.dtype == torch.int64 and torch.equal(got, counts.allocate(w))
    assert torch.equal(dispatch.allocate(w), got)  # auto on the CPU: these rows
    assert torch.equal(counts.allocate_rows(numba_rows, w.clone(), consume=True), got)


def test_allocate_rows_refuses_what_torch_refuses(numba_rows):
    for w in ([[0.7, 0.7]], [[0.3, 0.3]], [[1.5, -0.5]]):
        w = torch.tensor(w, dtype=torch.float64)
        with pytest.raises(DistributionError) as e:
            counts.allocate_rows(numba_rows, w)
        assert e.value.reason == Reason.ALLOCATION_INCONSISTENT
    with pytest.raises(DistributionError):  # torch's form: the first two only
        counts.allocate(torch.tensor([[0.7, 0.7]], dtype=torch.float64))


@pytest.mark.parametrize("top_k", [None, 1, 32, 5000])
def test_build_counts_auto_equals_torch_backend(numba_rows, top_k):
    g = np.random.default_rng(3 if top_k is None else top_k)
    x = torch.tensor(g.normal(0.0, 4.0, (3, 5000)))
    x[0] = 0.0  # all ties
    got = dispatch.build_counts(x, 0.9, top_k)
    want = torch_forms(lambda: dispatch.build_counts(x, 0.9, top_k, backend="torch"))
    if top_k is None:
        assert torch.equal(got, want) and torch.equal(got.sum(-1), torch.full((3,), MASS))
    else:
        assert torch.equal(got.ids, want.ids) and torch.equal(got.counts, want.counts)


def test_select_positions_equal_torch_on_ties(numba_rows):
    g = np.random.default_rng(4)
    for _ in range(60):
        n = int(g.integers(1, 3000))
        v = torch.tensor(g.integers(0, 5, (3, n)) / 4.0)  # few distinct values: many ties
        k = int(g.integers(1, n + 1))
        want = torch_forms(lambda v=v, k=k: topk.select_positions(v, k))
        assert torch.equal(topk.select_positions(v, k), want)
        # the numba pass itself, not its fallback to torch's form
        out = torch.empty(3, k, dtype=torch.int64)
        assert numba_counts.top_positions(v.numpy(), k, out.numpy()) == 0
        assert torch.equal(out, want)


def test_top_positions_on_wide_rows_and_its_fallbacks(numba_rows):
    g = np.random.default_rng(5)
    w = counts.softmax_weights(torch.tensor(g.normal(0.0, 4.0, (2, 129280))))
    out = torch.empty(2, 32, dtype=torch.int64)
    assert numba_counts.top_positions(w.numpy(), 32, out.numpy()) == 0
    assert torch.equal(out, torch_forms(lambda: topk.select_positions(w, 32)))
    ascending = torch.arange(5000, dtype=torch.float64).repeat(2, 1)  # replaces its heap
    assert numba_counts.top_positions(ascending.numpy(), 8, torch.empty(2, 8, dtype=torch.int64)
                                      .numpy()) == 2  # gives up: torch's form decides
    assert topk.select_positions(ascending, 8).tolist() == [list(range(4992, 5000))] * 2


@pytest.mark.parametrize("k", [1, 2])  # the NaN after the heap's first k values, or in them
def test_select_positions_with_nan_behaves_as_torch(numba_rows, k):
    v = torch.tensor([[0.5, float("nan"), 0.25, 0.5]], dtype=torch.float64)
    assert numba_counts.top_positions(v.numpy(), k, np.empty((1, k), np.int64)) == 1
    outcomes = []
    for run in (lambda: topk.select_positions(v, k),
                lambda: torch_forms(lambda: topk.select_positions(v, k))):
        try:
            outcomes.append(run().tolist())
        except Exception as e:  # noqa: BLE001 - whatever torch's form does, both do
            outcomes.append(type(e))
    assert outcomes[0] == outcomes[1]
