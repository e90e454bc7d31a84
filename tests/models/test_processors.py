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
