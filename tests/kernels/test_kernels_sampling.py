"""Kernels 3-5: integer proposal, sparse lookup, full-target residual sampling."""

import numpy as np
import pytest
import torch
from kernels_cases import drafts, target, u24, u53

from pp1q.core import reference as ref
from pp1q.core.errors import DistributionError, Reason
from pp1q.core.q import MASS, build_row, sample
from pp1q_kernels import lookup, proposal, residual
from pp1q_kernels.lookup import SparseCounts, count_at, dense_counts, from_rows


def oracle_residual_pick(p_row, q_row, u):
    """The rational oracle: exact residual of exactly normalised p, exact inverse CDF."""
    pd = ref.exact_dist(p_row.double().numpy())
    r = ref.residual(pd, ref.from_dyadic(q_row)) if q_row is not None else pd
    return None if r is None else ref.exact_pick(r, int(u))


def test_proposal_equals_q_sample_sparse_and_dense():
    g = np.random.default_rng(20)
    q, rows = drafts(g, (40,), 33, top_k=5)
    draws = u24(g, (40,))
    draws[:2] = torch.tensor([0, MASS - 1])
    want = [sample(r, int(u)) for r, u in zip(rows, draws, strict=True)]
    assert proposal.sample_counts(q, draws).tolist() == want
    assert proposal.sample_counts(dense_counts(q), draws).tolist() == want


def test_proposal_draw_out_of_range_refused():
    q, _ = drafts(np.random.default_rng(21), (1,), 5)
    for bad in (-1, MASS):
        with pytest.raises(DistributionError) as e:
            proposal.sample_counts(q, torch.tensor([bad]))
        assert e.value.reason == Reason.DRAW_OUT_OF_RANGE


def test_lookup_by_global_id_and_padding_never_matches():
    g = np.random.default_rng(22)
    q, rows = drafts(g, (6,), 50, top_k=4)
    assert q.width == 4 or bool((q.ids == 50).any())
    tokens = torch.tensor(g.integers(0, 50, (6, 30)))
    tokens[:, 0] = q.ids[:, 0]
    tokens[:, 1] = 49  # vocab - 1, also the id just below the padding id
    got = count_at(q.reshape(6, 1), tokens)
    want = [[r.count_of(int(t)) for t in tk] for r, tk in zip(rows, tokens, strict=True)]
    assert got.tolist() == want
    assert torch.equal(count_at(dense_counts(q).unsqueeze(1).expand(6, 30, 50), tokens), got)
    padded = SparseCounts(torch.tensor([[3, 50, 50]]), torch.tensor([[MASS, 0, 0]]), 50)
    padded.check()
    assert count_at(padded, torch.tensor([49])).tolist() == [0]
    assert dense_counts(padded)[0].nonzero().flatten().tolist() == [3]


def test_sparse_batch_checks_catch_non_canonical_rows():
    good = from_rows([build_row(np.zeros(4), top_k=2)], width=3)
    good.check()
    for ids in ([[1, 0, 4]], [[0, 4, 1]], [[0, 0, 4]]):
        bad = SparseCounts(torch.tensor(ids), good.counts, 4)
        with pytest.raises(Exception) as e:
            bad.check()
        assert e.value.reason in (Reason.NON_CANONICAL, Reason.WRONG_MASS)


@pytest.mark.parametrize("vocab", [2, 5, 31, 256, 300])
@pytest.mark.parametrize("top_k", [None, 1, 6])
def test_residual_equals_rational_oracle(vocab, top_k):
    g = np.random.default_rng(vocab * 10 + (top_k or 0))
    n = 24
    p = target(g, (n, vocab))
    q, rows = drafts(g, (n,), vocab, top_k=top_k)
    draws = u53(g, (n,))
    draws[:2] = torch.tensor([0, 2**53 - 1])
    use_q = torch.tensor([i % 5 != 4 for i in range(n)])  # some rows sample p (bonus)
    for qq in (q, dense_counts(q)):
        ids, under = residual.residual_sample(p, qq, draws, use_q=use_q)
        for i in range(n):
            want = oracle_residual_pick(p[i], rows[i] if use_q[i] else None, draws[i])
            if want is None:  # p == q exactly: no residual; the kernel picks from p, flagged
                assert bool(under[i]) and int(ids[i]) == oracle_residual_pick(p[i], None, draws[i])
            else:
                assert not bool(under[i]) and int(ids[i]) == want


@pytest.mark.parametrize("block", [4, 7, 256])
def test_vocabulary_boundaries_never_yield_padding_or_out_of_range(block):
    vocab = 37  # not a multiple of any block here
    # all target mass on the last id, vocab - 1
    p = torch.zeros(3, vocab)
    p[:, -1] = 1.0
    q, _ = drafts(np.random.default_rng(23), (3,), vocab, top_k=3)
    edge = u53(np.random.default_rng(24), (3,))
    edge[0], edge[1] = 0, 2**53 - 1
    for qq in (q, dense_counts(q), None):
        ids, under = residual.residual_sample(p, qq, edge, block=block)
        assert ids.tolist() == [vocab - 1] * 3 and not bool(under.any())
    # all residual mass outside the sparse support: q covers ids 0..2, p lives on 30..36
    q0 = from_rows([build_row(np.r_[np.zeros(3), np.full(vocab - 3, -np.inf)], top_k=3)] * 3)
    p2 = torch.zeros(3, vocab)
    p2[:, 30:] = 1.0 / 7
    ids, _ = residual.residual_sample(p2, q0, edge, block=block)
    assert all(30 <= i < vocab for i in ids.tolist())
    # a sweep of draws over one row: every id is a positive-residual id < vocab
    g = np.random.default_rng(25)
    p3 = target(g, (1, vocab)).expand(2000, vocab)
    q3, rows = drafts(g, (1,), vocab, top_k=4)
    q3 = SparseCounts(q3.ids.expand(2000, -1), q3.counts.expand(2000, -1), vocab)
    ids, _ = residual.residual_sample(p3, q3, u53(g, (2000,)), block=block)
    r = ref.residual(ref.exact_dist(p3[0].double().numpy()), ref.from_dyadic(rows[0]))
    assert set(ids.tolist()) <= set(r.ids) and int(ids.max()) < vocab


def test_underflow_is_defined_flagged_and_picks_from_p_with_the_same_draw():
    row = build_row(np.log(np.arange(1, 9, dtype=np.float64)))
    p = torch.tensor(row.to_dense()).unsqueeze(0).expand(4, 8)  # p == q exactly
    q = from_rows([row] * 4)
    draws = torch.tensor([0, 2**52, 2**53 - 1, 12345])
    for qq in (q, dense_counts(q)):
        ids, under = residual.residual_sample(p, qq, draws)
        assert under.tolist() == [True] * 4
        assert ids.tolist() == residual.target_sample(p, draws).tolist()


def test_pp1q_verify_underflow_case_is_exact_here():
    """pp1q.core.verify's float64 residual can round to zero when p and q differ in the last
    bits; the fixed-point residual keeps those bits, so it returns the oracle's pick."""
    row = build_row(np.zeros(4))  # counts 4194304 each, q = 1/4
    p = torch.tensor([[0.25 + 2.0**-40, 0.25, 0.25, 0.25 - 2.0**-40]], dtype=torch.float64)
    ids, under = residual.residual_sample(p, from_rows([row]), torch.tensor([2**52]))
    assert not bool(under[0]) and int(ids[0]) == oracle_residual_pick(p[0], row, 2**52) == 0


@pytest.mark.parametrize("bad,reason", [
    (float("nan"), Reason.NON_FINITE), (-0.5, Reason.NEGATIVE_VALUE), (1.5, Reason.WRONG_MASS),
])
def test_invalid_target_rows_refused(bad, reason):
    p = torch.full((1, 4), 0.25)
    p[0, 1] = bad
    with pytest.raises(DistributionError) as e:
        residual.residual_sample(p, None, torch.tensor([1]))
    assert e.value.reason == reason


def test_zero_and_oversized_target_mass_refused():
    for p, reason in ((torch.zeros(1, 4), Reason.ZERO_MASS), (torch.ones(1, 4), Reason.WRONG_MASS)):
        with pytest.raises(DistributionError) as e:
            residual.residual_sample(p, None, torch.tensor([1]))
        assert e.value.reason == reason


def test_restrict_rebases_a_shard_and_keeps_padding_last():
    q = from_rows([build_row(np.arange(10.0), top_k=5)])  # ids 5..9
    part = lookup.restrict(q, 3, 8)
    assert part.ids.tolist() == [[2, 3, 4, 5, 5]] and part.vocab == 5
    assert part.counts[0, :3].tolist() == q.counts[0, :3].tolist()
    assert int(part.counts[0, 3:].sum()) == 0
