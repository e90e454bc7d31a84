"""Triton kernels bit for bit against the torch path.

Without a GPU the kernels run under TRITON_INTERPRET=1 on CPU tensors (set here before
triton is first imported); with CUDA and no TRITON_INTERPRET they run compiled on the
GPU. Shapes stay tiny: the interpreter executes every program in Python.
"""

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from kernels_cases import drafts, keys, same, sampled_drafts, target, u53  # noqa: E402

from pp1q.core import rng  # noqa: E402
from pp1q.core.errors import DistributionError, Reason  # noqa: E402
from pp1q.core.q import build_row  # noqa: E402
from pp1q_kernels import counts, dispatch, residual, triton_counts, triton_residual, triton_verify  # noqa: E402  # noqa: E402
from pp1q_kernels import triton_common as tc  # noqa: E402
from pp1q_kernels import verify_step as vs  # noqa: E402
from pp1q_kernels.lookup import dense_counts, from_rows  # noqa: E402
from pp1q_kernels.philox import seed_tensor  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cpu" if INTERPRET else "cuda"
BLOCK = 16  # small tiles, so vocabularies below cross tile edges (and one is a multiple)


@pytest.fixture(autouse=True, scope="module")
def _interpreter_really_on():
    if INTERPRET:
        from triton.runtime.interpreter import InterpretedFunction
        if not isinstance(triton_residual._pick, InterpretedFunction):
            pytest.fail("triton was imported before TRITON_INTERPRET=1 was set; run this "
                        "file on its own or export TRITON_INTERPRET=1")


def test_tl_philox_gives_the_words_of_pp1q_rng():
    g = np.random.default_rng(40)
    ctr = g.integers(0, 2**32, (200, 4), dtype=np.uint64)
    seeds = [0, 2**64 - 1, 2**63, 0x299F31D0A4093822] + [int(s) for s in
                                                          g.integers(0, 2**64, 196, np.uint64)]
    ctr[3] = [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]  # Random123 known answer
    words = tc.philox_words(torch.tensor(ctr.astype(np.int64), device=DEV),
                            seed_tensor(seeds, DEV)).cpu().numpy()
    key = np.array([[s & 0xFFFFFFFF, s >> 32] for s in seeds], dtype=np.uint64)
    assert np.array_equal(words, rng.philox4x32_10(ctr, key).astype(np.int64))
    assert words[3].tolist() == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


@pytest.mark.experiment
@pytest.mark.parametrize("vocab", [5, 37, 64])
def test_residual_bit_for_bit(vocab):
    g = np.random.default_rng(vocab)
    n = 6
    p = target(g, (n, vocab)).to(DEV)
    q = from_rows(drafts(g, (n,), vocab, top_k=4)[1], device=DEV)
    draws = u53(g, (n,)).to(DEV)
    draws[:2] = torch.tensor([0, 2**53 - 1])
    use_q = torch.tensor([True, True, False, True, True, False], device=DEV)
    for qq in (None, q, dense_counts(q)):
        for uq in (None, use_q):
            want = residual.residual_sample(p, qq, draws, use_q=uq)
            assert same(triton_residual.residual_sample(p, qq, draws, use_q=uq, block=BLOCK), want)
    for dtype in (torch.float64, torch.bfloat16):  # wider and narrower target rows
        pd = p.to(dtype)
        assert same(triton_residual.residual_sample(pd, q, draws, block=BLOCK),
                    residual.residual_sample(pd, q, draws))


def test_residual_vocabulary_edges_and_underflow_bit_for_bit():
    vocab = 37
    edge = torch.tensor([0, 2**52, 2**53 - 1], device=DEV)
    last = torch.zeros(3, vocab, device=DEV)
    last[:, -1] = 1.0  # all mass on id vocab - 1
    outside = torch.zeros(3, vocab, device=DEV)
    outside[:, 30:] = 1.0 / 7  # all mass outside the sparse support (ids 0..2)
    q0 = from_rows([build_row(np.r_[np.zeros(3), np.full(vocab - 3, -np.inf)])] * 3,
                   width=5, device=DEV)
    row = build_row(np.log(np.arange(1, vocab + 1, dtype=np.float64)))
    equal = torch.tensor(row.to_dense(), device=DEV).expand(3, vocab)  # p == q: underflow
    qe = from_rows([row] * 3, device=DEV)
    for p, q in ((last, q0), (outside, q0), (equal, qe)):
        for qq in (q, dense_counts(q)):
            want = residual.residual_sample(p, qq, edge)
            got = triton_residual.residual_sample(p, qq, edge, block=BLOCK)
            assert same(got, want) and int(got[0].max()) < vocab
    assert triton_residual.residual_sample(last, q0, edge, block=BLOCK)[0].tolist() == [36] * 3
    assert triton_residual.residual_sample(equal, qe, edge, block=BLOCK)[1].all()
    with pytest.raises(DistributionError) as e:
        triton_residual.residual_sample(torch.zeros(1, vocab, device=DEV), None, edge[:1])
    assert e.value.reason == Reason.ZERO_MASS


@pytest.mark.parametrize("sparse", [True, False])
def test_verify_step_bit_for_bit_with_per_request_seeds(sparse):
    g = np.random.default_rng(41 + sparse)
    B, D, V = 4, 3, 21
    t_logits = g.normal(0, 2, (B, D + 1, V))
    p = torch.softmax(torch.tensor(t_logits, dtype=torch.float32), -1).to(DEV)
    d_logits = np.concatenate([-t_logits[:2, :D], t_logits[2:, :D] + 0.2], 0)
    q, _ = drafts(g, (B, D), V, top_k=5 if sparse else None, logits=d_logits)
    draft = sampled_drafts(g, q).to(DEV)
    q = q if sparse else dense_counts(q)
    q = type(q)(q.ids.to(DEV), q.counts.to(DEV), q.vocab) if sparse else q.to(DEV)
    k = keys(g, B)
    k[3] = type(k[0])(2**64 - 1, k[3].generation, k[3].round_id, k[3].first_position)
    sk = vs.StepKeys.from_keys(k, DEV)
    want = vs.verify_step(p, q, draft, sk)
    got = triton_verify.verify_step(p, q, draft, sk, block=BLOCK)
    assert same(got, want)
    first = triton_verify.verify_step(p[:1], q[:1] if not sparse else q.index(slice(0, 1)),
                                      draft[:1], vs.StepKeys.from_keys(k[:1], DEV), block=BLOCK)
    assert same(first, vs.StepResult(want.accepted[:1], want.token[:1], want.underflow[:1]))


@pytest.mark.experiment
def test_allocation_bit_for_bit():
    g = np.random.default_rng(43)
    x = torch.tensor(g.normal(0, 3, (4, 40)))
    x[0] = 0.0  # every remainder tied
    x[1, :30] = -float("inf")
    x[2, 7] = 60.0  # one dominant id, the rest vanish
    w = counts.softmax_weights(x).to(DEV)
    assert same(triton_counts.allocate(w, block=BLOCK), counts.allocate(w))
    one = torch.ones(1, 1, dtype=torch.float64, device=DEV)
    assert triton_counts.allocate(one, block=BLOCK).tolist() == [[2**24]]
    with pytest.raises(DistributionError) as e:
        triton_counts.allocate(torch.full((1, 3), 0.5, dtype=torch.float64, device=DEV))
    assert e.value.reason == Reason.ALLOCATION_INCONSISTENT


def test_dispatch_picks_triton_on_request_and_torch_on_cpu_by_default():
    p = torch.softmax(torch.randn(2, 9, generator=torch.Generator().manual_seed(1)), -1).to(DEV)
    draws = torch.tensor([5, 2**50], device=DEV)
    assert dispatch.backend_for(torch.zeros(1)) == "torch"
    assert dispatch.backend_for(p, "triton") == "triton"
    assert same(dispatch.residual_sample(p, None, draws, backend="triton"),
                dispatch.residual_sample(p, None, draws, backend="torch"))
