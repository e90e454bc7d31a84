"""processed_probs against a plain numpy reference written from the definition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pp1q.core.errors import DistributionError, Reason
from pp1q.models.processors import processed_probs


def reference(logits: np.ndarray, temperature: float, top_k, top_p) -> np.ndarray:
    """One row: softmax(x / T); keep the k largest (ties: lowest id); then the shortest
    descending prefix of the renormalised rest whose mass reaches top_p."""
    x = logits.astype(np.float64) / temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    order = sorted(range(p.size), key=lambda j: (-p[j], j))
    kept = order[: top_k or p.size]
    if top_p is not None and top_p < 1:
        mass = sum(p[j] for j in kept)
        run, cut = 0.0, []
        for j in kept:
            if run >= top_p:
                break
            cut.append(j)
            run += p[j] / mass
        kept = cut
    out = np.zeros_like(p)
    out[kept] = p[kept]
    return out / out.sum()


CASES = [(1.0, None, None), (0.7, None, None), (1.3, 20, None), (0.7, None, 0.9),
         (0.9, 40, 0.8), (2.0, 1, None), (0.5, None, 0.05), (1.0, 500, 1.0)]


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), CASES)
def test_matches_reference(temperature, top_k, top_p):
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((3, 300)) * 3
    logits[1, rng.choice(300, 40, replace=False)] = 2.5  # ties straddling the boundaries
    got = processed_probs(torch.from_numpy(logits).float(), temperature, top_k, top_p)
    assert got.dtype == torch.float64 and got.shape == (3, 300)
    for r in range(3):
        want = reference(logits.astype(np.float32)[r], temperature, top_k, top_p)
        assert np.array_equal(got[r].numpy() > 0, want > 0)  # the same kept set
        np.testing.assert_allclose(got[r].numpy(), want, rtol=1e-12, atol=1e-15)


def test_plain_temperature_is_softmax():
    x = torch.randn(1000, dtype=torch.float64)
    assert torch.equal(processed_probs(x), torch.softmax(x, -1))
    assert torch.allclose(processed_probs(x, 0.5), torch.softmax(x / 0.5, -1), rtol=0, atol=0)


def test_ties_keep_lowest_ids():
    x = torch.zeros(10)
    got = processed_probs(x, 1.0, top_k=3)
    assert got.nonzero().flatten().tolist() == [0, 1, 2]
    got = processed_probs(x, 1.0, top_p=0.35)  # 0.1 each: 4 ids reach 0.35
    assert got.nonzero().flatten().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"temperature": 0.0}, Reason.BAD_TEMPERATURE),
    ({"temperature": float("nan")}, Reason.BAD_TEMPERATURE),
    ({"top_k": 0}, Reason.BAD_TOP_K),
    ({"top_p": 0.0}, Reason.BAD_TOP_P),
    ({"top_p": 1.5}, Reason.BAD_TOP_P),
])
def test_refusals(kwargs, reason):
    with pytest.raises(DistributionError) as err:
        processed_probs(torch.zeros(4), **kwargs)
    assert err.value.reason is reason


def test_bad_logits_refused():
    with pytest.raises(DistributionError) as err:
        processed_probs(torch.tensor([0.0, float("nan")]))
    assert err.value.reason is Reason.NAN_LOGIT
    with pytest.raises(DistributionError) as err:
        processed_probs(torch.tensor([0.0, float("inf")]))
    assert err.value.reason is Reason.POSINF_LOGIT


@pytest.mark.parametrize(("top_k", "top_p"), [(None, None), (3, None), (None, 0.9), (3, 0.5)])
def test_no_rows_give_no_rows(top_k, top_p):
    """Logits with no rows ([0, V]) give p of the same shape under every processor (top-p
    raised torch.cat's ValueError on them, found by a fuzzer)."""
    p = processed_probs(torch.zeros(0, 10), 0.7, top_k, top_p)
    assert p.shape == (0, 10) and p.dtype == torch.float64


def full_sort(logits: torch.Tensor, temperature: float, top_k, top_p) -> torch.Tensor:
    """The definition with one full stable sort per row (what processed_probs avoids):
    top-k mass summed in id order, running sum over the whole descending order."""
    p = torch.softmax(logits.double() / temperature, -1)
    out = torch.zeros_like(p)
    for r in range(p.shape[0]):
        order = torch.argsort(p[r], descending=True, stable=True)
        kept = order[: top_k or p.shape[1]]
        if top_p is not None and top_p < 1:
            mask = torch.zeros_like(p[r], dtype=torch.bool)
            mask[kept] = True
            total = torch.where(mask, p[r], 0.0).sum()
            run = torch.cumsum(p[r][kept] / total, 0)
            kept = kept[torch.cat([run.new_zeros(1), run[:-1]]) < top_p]
        out[r, kept] = p[r, kept]
    return out / out.sum(-1, keepdim=True)


@pytest.mark.parametrize(("scale", "temperature", "top_k", "top_p"), [
    (3.0, 0.7, None, 0.9), (3.0, 1.0, None, 0.5), (3.0, 1.0, 40, 0.8), (3.0, 1.0, 3000, 0.95),
    (0.05, 1.0, None, 0.9),  # nearly flat: thousands of candidates in the binade
    (0.05, 1.0, None, 0.999), (8.0, 0.5, None, 0.05), (3.0, 1.0, 17, None),
    (3.0, 1.0, None, 0.9999999999999999)])  # past the binned mass: every id with mass
def test_prefix_search_equals_a_full_sort(scale, temperature, top_k, top_p):
    rng = np.random.default_rng(11)
    logits = torch.from_numpy(rng.standard_normal((4, 5000)) * scale).float()
    logits[1, torch.from_numpy(rng.choice(5000, 300, replace=False))] = 0.5 * scale
    logits[2] = torch.round(logits[2] * 4) / 4  # ties everywhere, at every boundary
    got = processed_probs(logits, temperature, top_k, top_p)
    assert torch.equal(got, full_sort(logits, temperature, top_k, top_p))
    if top_p is not None and scale < 0.1:  # a nucleus of thousands, not a few ids
        assert int((got[0] > 0).sum()) > 1000


def test_overflow_after_temperature_is_zero_mass():
    with pytest.raises(DistributionError) as err:
        processed_probs(torch.tensor([1e300, 0.0], dtype=torch.float64), 1e-10)
    assert err.value.reason is Reason.ZERO_MASS
    with pytest.raises(DistributionError) as err:
        processed_probs(torch.full((3,), float("-inf")))
    assert err.value.reason is Reason.ZERO_MASS
    with pytest.raises(DistributionError) as err:  # NaN wins over +inf, as before
        processed_probs(torch.tensor([float("inf"), float("nan")]))
    assert err.value.reason is Reason.NAN_LOGIT


def test_candidates_that_may_end_too_early_are_refused():
    # the binned mass only proposes candidates: a prefix whose running sum stays under
    # top_p could be followed by kept ids, so it must not be taken as the answer
    from pp1q.models.processors import _prefix_length

    share = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)  # in descending order
    assert _prefix_length(share[:1], 0.9, complete=False) is None
    assert _prefix_length(share, 0.9, complete=False) == 3
    assert _prefix_length(share[:2], 0.7, complete=False) == 2
    assert _prefix_length(share[:1], 0.9, complete=True) == 1
    assert _prefix_length(share[:0], 0.9, complete=True) == 0


# The reads of device tensors back to the host that top-p makes, whatever the rows (each
# a wait on a GPU): the refusal flags, its candidates' count (nonzero), and every
# candidate's row and share of the row's mass, for all rows at once.
TOP_P_READS = 3


@pytest.mark.parametrize("top_k", [None, 40])
def test_top_p_reads_the_device_as_often_for_six_rows_as_for_one(top_k):
    """Counted on the CPU by tests/support/host_reads.py (the logits marked as a GPU
    target's). Until 2 Dec 2026 each row read its shares and took its kept ids by a
    mask, two reads a row: 5 for one row, 15 for six."""
    from host_reads import HostReads

    rng = np.random.default_rng(5)
    reads = {}
    for rows in (1, 6):
        logits = torch.from_numpy(rng.standard_normal((rows, 5000)) * 3.0)
        with HostReads() as mode:
            mode.on_device(logits)
            got = processed_probs(logits, 0.7, top_k, 0.9)
        assert torch.equal(got, full_sort(logits, 0.7, top_k, 0.9))
        reads[rows] = mode.reads
    assert reads[6] == reads[1] <= TOP_P_READS, reads
