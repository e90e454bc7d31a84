"""The sharding emulator: every kernel split over N = 1..4 vocabulary shards."""

import numpy as np
import pytest
import torch
from kernels_cases import drafts, keys, same, sampled_drafts, target, u24, u53
from stats import g_test

from pp1q.core import reference as ref
from pp1q.core.errors import LocalProtocolError
from pp1q.core.q import build_row
from pp1q.core.rng import Domain
from pp1q_kernels import counts, proposal, residual, topk
from pp1q_kernels import verify_step as vs
from pp1q_kernels.lookup import count_at, dense_counts, from_rows
from pp1q_kernels.philox import keyed_u53, seed_tensor
from pp1q_kernels.shard_comm import ShardLayout
from pp1q_kernels.shard_emulator import run_sharded, scatter

V = 37


def layouts(vocab=V):
    g = np.random.default_rng(vocab)
    out = []
    for n in (1, 2, 3, 4):
        out.append(ShardLayout.even(vocab, n))  # ceil split: the last shard is smaller
        if n > 1:
            out.append(ShardLayout.cuts(vocab, sorted(g.choice(np.arange(1, vocab), n - 1,
                                                               replace=False).tolist())))
    out.append(ShardLayout.cuts(vocab, [1, vocab - 1]))  # one-id shards at both ends
    return out


LAYOUTS = layouts()


def ids(layout):
    return "-".join(f"{lo}:{hi}" for lo, hi in layout.bounds)


@pytest.mark.parametrize("layout", LAYOUTS, ids=ids)
def test_counts_and_topk_bit_identical_to_unsharded_and_build_row(layout):
    g = np.random.default_rng(50 + layout.n)
    x = torch.tensor(g.normal(0, 3, (6, V)))
    x[0] = 0.0  # all ties
    x[1, 2:30] = -float("inf")
    got, _ = run_sharded("counts", layout, x, 0.8)
    assert same(got, counts.build_counts(x, 0.8))
    assert [r.tolist() for r in got] == [build_row(x[i].numpy(), temperature=0.8)
                                        .dense_counts().tolist() for i in range(6)]
    for k in (1, 5, V, V + 3):
        sharded, _ = run_sharded("counts", layout, x, 0.8, top_k=k)
        assert same(sharded, counts.build_counts(x, 0.8, top_k=k))
    w = counts.softmax_weights(x)
    assert same(run_sharded("topk", layout, w, 6)[0], topk.topk_support(w, 6))


@pytest.mark.parametrize("layout", LAYOUTS, ids=ids)
def test_proposal_lookup_residual_identical_to_unsharded(layout):
    g = np.random.default_rng(60 + layout.n)
    q, _ = drafts(g, (12,), V, top_k=6)
    p = target(g, (12, V))
    p[0] = dense_counts(q)[0].to(torch.float32) / 2**24  # p == q: residual underflow row
    draws24, draws53 = u24(g, (12,)), u53(g, (12,))
    draws53[:2] = torch.tensor([0, 2**53 - 1])
    tokens = torch.tensor(g.integers(0, V, (12,)))
    tokens[1] = V - 1
    use_q = torch.tensor([i % 4 != 3 for i in range(12)])
    for qq in (q, dense_counts(q)):
        assert same(run_sharded("proposal", layout, qq, draws24)[0],
                    proposal.sample_counts(qq, draws24))
        assert same(run_sharded("lookup", layout, qq, tokens)[0], count_at(qq, tokens))
        assert same(scatter(layout, qq), dense_counts(q))
        got, _ = run_sharded("residual", layout, p, qq, draws53, use_q=use_q)
        assert same(got, residual.residual_sample(p, qq, draws53, use_q=use_q))
        assert bool(got[1][0])


@pytest.mark.parametrize("layout", LAYOUTS, ids=ids)
def test_verification_step_identical_to_unsharded(layout):
    g = np.random.default_rng(70 + layout.n)
    B, D = 5, 3
    t_logits = g.normal(0, 2, (B, D + 1, V))
    p = torch.softmax(torch.tensor(t_logits, dtype=torch.float32), -1)
    d_logits = np.concatenate([-t_logits[:2, :D], t_logits[2:, :D] + 0.1], 0)
    q, _ = drafts(g, (B, D), V, top_k=8, logits=d_logits)
    draft = sampled_drafts(g, q)
    sk = vs.StepKeys.from_keys(keys(g, B))
    for qq in (q, dense_counts(q)):
        assert same(run_sharded("verify", layout, p, qq, draft, sk)[0],
                    vs.verify_step(p, qq, draft, sk))


def test_no_collective_carries_a_vocabulary_row():
    """Payloads are per-row scalars, limbs or top-k candidates: the same at V=37 and 301."""
    payload = {}
    for vocab in (V, 301):
        g = np.random.default_rng(80)
        lay = ShardLayout.even(vocab, 3)
        x = torch.tensor(g.normal(0, 2, (4, vocab)))
        q, _ = drafts(g, (4,), vocab, top_k=5)
        logs = [run_sharded("counts", lay, x)[1], run_sharded("counts", lay, x, top_k=5)[1],
                run_sharded("residual", lay, target(g, (4, vocab)), q, u53(g, (4,)))[1],
                run_sharded("proposal", lay, q, u24(g, (4,)))[1]]
        payload[vocab] = max(n for log in logs for _, n in log)
    assert payload[V] == payload[301] <= 4 * 5


def test_a_zero_mass_shard_is_never_chosen():
    lay = ShardLayout.cuts(V, [10, 20, 30])
    n = 3000
    p = torch.zeros(n, V)
    p[:, 22:26] = 0.25  # all target mass in shard 2
    q = from_rows([build_row(np.r_[np.zeros(5), np.full(V - 5, -np.inf)])] * n)  # shard 0
    g = np.random.default_rng(81)
    for second in (None, u53(g, (n,))):
        got, _ = run_sharded("residual", lay, p, q, u53(g, (n,)), second=second)
        assert set(got[0].tolist()) <= {22, 23, 24, 25}
    props, _ = run_sharded("proposal", lay, q, u24(g, (n,)))
    assert set(props.tolist()) <= {0, 1, 2, 3, 4}


def two_draw_counts(layout, n, shard_by="residual", seed=5):
    """Token histogram of the two-draw sharded residual over n keyed draws."""
    # most p mass sits in the first shard, where q is larger still (residual only at id 3)
    t_logits = np.array([3, 3, 3, 3, 0, 0.5, 1, 0, 0.2, -1, -0.5, 0])
    p_row = torch.softmax(torch.tensor(t_logits, dtype=torch.float32), -1)
    q_row = build_row(np.array([4.0, 4, 4, 1] + [-3] * 8))
    pos = torch.arange(n)
    s = seed_tensor([seed])
    u1 = keyed_u53(s, 1, 2, pos, Domain.CORRECTION, counter=0)
    u2 = keyed_u53(s, 1, 2, pos, Domain.CORRECTION, counter=1)  # the owner's own draw
    q = from_rows([q_row])
    q = type(q)(q.ids.expand(n, -1), q.counts.expand(n, -1), q.vocab)
    got, _ = run_sharded("residual", layout, p_row.expand(n, 12), q, u1, second=u2,
                         shard_by=shard_by)
    exact = ref.residual(ref.exact_dist(p_row.double().numpy()), ref.from_dyadic(q_row))
    probs = [float(f) for f in exact.probs()]
    return np.bincount(got[0].numpy(), minlength=12), probs


def check_two_draw(n, layouts_):
    for lay in layouts_:
        obs, probs = two_draw_counts(lay, n)
        assert not g_test(obs, probs).rejected, (lay.bounds, g_test(obs, probs))
        bug_obs, _ = two_draw_counts(lay, n, shard_by="p_mass")
        assert g_test(bug_obs, probs).rejected, (lay.bounds, g_test(bug_obs, probs))


def test_two_draw_form_equal_in_distribution_and_planted_bug_rejected():
    """Seed's literal form: leader draw picks the shard, the owner's own keyed draw picks
    the token. The G test (tests/support/stats.py: false alarms under 1e-6) against the
    exact residual; the planted bug (shard chosen by its p mass, not its residual mass)
    must be rejected."""
    check_two_draw(40_000, [ShardLayout.cuts(12, [4, 9])])


@pytest.mark.slow
def test_two_draw_form_long():
    check_two_draw(400_000, [ShardLayout.even(12, n) for n in (2, 3, 4)]
                   + [ShardLayout.cuts(12, [4, 5, 11])])


def test_layout_refusals():
    for bad in (lambda: ShardLayout.even(5, 4), lambda: ShardLayout.cuts(9, [3, 3]),
                lambda: ShardLayout.cuts(9, [1, 2, 3, 4])):
        with pytest.raises(LocalProtocolError):
            bad()
