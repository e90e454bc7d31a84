"""The worker's host staging for a drafter's logits (pp1q.models.proposal.HostStaging):
the design's "preallocated registered host staging". A CPU tensor is read where it is;
an accelerator's lands in one page-locked buffer reused row after row, which is safe only
because build_row keeps nothing that views what it read: the first test holds build_row
to that on the CPU (the buffer overwritten after every row, as the next row overwrites
it); the CUDA test runs where a GPU is (scripts/device_check.sh)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pp1q.core.q import build_row
from pp1q.models.proposal import HostStaging

VOCAB = 300


def _fields(row) -> tuple:
    q = row.dense_q()
    return (row.ids.tobytes(), row.counts.tobytes(), None if q is None else q.tobytes())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, None), (0.7, None), (1.0, 16),
                                                    (1.3, 5)])
def test_a_row_keeps_nothing_of_the_logits_it_was_built_from(dtype, temperature, top_k):
    g = torch.Generator().manual_seed(5)
    buf = torch.empty(VOCAB, dtype=dtype)  # one buffer, as the staging reuses one
    for _ in range(3):
        buf.copy_(torch.randn(VOCAB, generator=g, dtype=torch.float64) * 3.0)
        row = build_row(buf, temperature=temperature, top_k=top_k)
        before = _fields(row)
        assert before == _fields(build_row(buf.clone(), temperature=temperature, top_k=top_k))
        buf.fill_(-1.0e30)  # the next row's copy overwrites it
        assert _fields(row) == before


def test_cpu_logits_are_read_where_they_are():
    staging = HostStaging()
    logits = torch.randn(VOCAB)
    assert staging.host(logits) is logits


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_accelerator_logits_land_in_one_pinned_buffer():
    staging = HostStaging()
    first = torch.randn(VOCAB, device="cuda")
    host = staging.host(first)
    assert host.device.type == "cpu" and host.is_pinned()
    assert torch.equal(host, first.cpu())
    row = build_row(host, top_k=16)
    second = torch.randn(VOCAB, device="cuda")
    again = staging.host(second)
    assert again.data_ptr() == host.data_ptr()  # reused, not reallocated
    assert torch.equal(again, second.cpu())
    assert _fields(row) == _fields(build_row(first.cpu(), top_k=16))  # built before: kept
    wider = staging.host(torch.randn(VOCAB + 1, device="cuda", dtype=torch.float64))
    assert wider.shape == (VOCAB + 1,) and wider.dtype == torch.float64 and wider.is_pinned()
    assert np.isfinite(wider.numpy()).all()
