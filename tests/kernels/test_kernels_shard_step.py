"""The exact sampler over ranks that each hold one vocabulary shard (kernels/shard_step).

N simulated ranks run the same per-rank generators the verifier ranks run over gloo
(shard_spmd.lockstep); each is compared with one rank (the whole row), with the
one-process kernels (pp1q.verifier.kernel_rounds) and with the rational oracle. The
gloo form of the same comparison is tests/verifier/ranks/test_ranks_shard_gloo.py.
"""

import numpy as np
import pytest
import torch
from shard_cases import (
    ONE,
    SPLITS,
    Case,
    D,
    V,
    cases,
    greedy_on,
    round_keys,
    round_on,
    target_only_on,
)
from stats import g_test

from pp1q.core import reference as ref
from pp1q.core.errors import DistributionError, LocalProtocolError, Reason
from pp1q.core.q import build_row, sample
from pp1q.core.rng import proposal_u24
from pp1q.core.verify import RoundKeys, target_only_draw
from pp1q.verifier.kernel_rounds import KernelRounds
from pp1q_kernels import shard_step as ss
from pp1q_kernels.fixed import to_fixed
from pp1q_kernels.lookup import dense_counts, from_rows
from pp1q_kernels.shard_comm import ShardLayout
from pp1q_kernels.shard_spmd import CollectiveLog, Gather, Sum, deliver, simulate

ROUNDS = 600  # default run (~10 s on two cores)
ROUNDS_SLOW = 10_000  # the count: --runslow

def bit_identical_run(n_rounds: int) -> dict:
    kr = KernelRounds()
    pool = cases()
    seen = {"correction": 0, "bonus": 0, "under": 0, "target_only": 0}
    for k in range(n_rounds):
        case = pool[k % len(pool)]
        keys = round_keys(k)
        if k % 10 == 9:  # a target-only step (the bonus pick's path with no drafts)
            u = target_only_draw(keys, keys.first_position)
            want = int(KernelRounds().target_only(case.p[0].numpy(), keys,
                                                  keys.first_position).token)
            assert [target_only_on(lay, case, u) for lay in [ONE, *SPLITS]] == [want] * 3
            seen["target_only"] += 1
            continue
        want = kr.sampled([case.p.numpy()], [case.rows], [case.drafts], [keys])[0]
        got = [round_on(lay, case, keys) for lay in [ONE, *SPLITS]]
        assert {g[:2] for g in got} == {(want.accepted, want.token)}, (k, want, got)
        seen["bonus" if want.accepted == D else "correction"] += 1
        seen["under"] += got[0][2]
    return seen


@pytest.mark.experiment
def test_two_and_three_uneven_shards_decide_as_one_rank_and_the_kernels():
    seen = bit_identical_run(ROUNDS)
    assert seen["correction"] > ROUNDS // 4 and seen["bonus"] > ROUNDS // 20  # both paths
    assert seen["target_only"] == ROUNDS // 10


@pytest.mark.slow
def test_ten_thousand_rounds_bit_identical():
    bit_identical_run(ROUNDS_SLOW)


def test_greedy_rounds_take_the_global_argmax():
    for case in cases(n=12):
        best = case.logits.numpy().argmax(-1)
        acc = 0
        while acc < D and case.drafts[acc] == best[acc]:
            acc += 1
        assert all(greedy_on(lay, case) == (acc, int(best[acc])) for lay in [ONE, *SPLITS])
    tie = cases(n=1)[0]
    tie.logits[:] = 0.0  # every id ties: the lowest id wins, whatever shard holds it
    assert greedy_on(SPLITS[1], tie)[1] == 0


def test_decisions_equal_the_rational_oracle_on_the_fixed_point_rows():
    pool = cases(seed=11, n=6)
    for k in range(60):
        case = pool[k % len(pool)]
        keys = RoundKeys(99 + k, 2, k, 40)
        P = (case.p.double() * float(1 << 61)).to(torch.int64)  # fixed.to_fixed
        rows = [{i: int(v) for i, v in enumerate(r.tolist()) if v} for r in P]
        oracle = ref.oracle_round([ref.exact_dist(r, V) for r in rows], case.rows,
                                  case.drafts, ref.RoundDraws.from_keys(keys, D))
        assert round_on(SPLITS[1], case, keys)[:2] == (oracle.accepted, oracle.token)


def test_no_collective_carries_a_vocabulary_row():
    widest = max(hi - lo for lo, hi in SPLITS[1].bounds)
    for lay in SPLITS:
        for k, case in enumerate(cases(n=8)):
            log = CollectiveLog()
            round_on(lay, case, RoundKeys(k, 1, k, 3), log=log)
            # six collectives; the widest is the (D+1) x 2 limb sum, never a shard of V
            assert len(log.entries) == 6 and log.max_elements() == 2 * (D + 1) < widest
            assert log.bytes_sent() < V * 8 / 2  # a whole round: under half a float64 row
            log = CollectiveLog()
            target_only_on(lay, case, 12345 + k, log=log)
            assert log.max_elements() <= 2 * (D + 1)
            log = CollectiveLog()
            greedy_on(lay, case, log=log)
            assert log.max_elements() <= 2 * (D + 1)


def test_a_rank_without_residual_mass_is_never_picked():
    # pick() over masses [5, 0, 3]: every threshold 0..7 reached by a draw; rank 1 never
    layout = ShardLayout.cuts(6, [2, 4])
    R = torch.tensor([2, 3, 0, 0, 1, 2])
    owners = set()
    for t in range(8):
        u = -(-(t << 53) // 8)  # the smallest u with floor(u * 8 / 2^53) == t
        tok, under = simulate(layout.bounds, lambda pl, u=u: ss.pick(
            pl, R[pl.lo:pl.hi], R[pl.lo:pl.hi] + 1, u))[0]
        owners.add(tok // 2)
        assert not under and R[tok] > 0
    assert owners == {0, 2}
    # and in whole rounds: q covers shard 1 with more than p there, so its residual is
    # empty; the gathered masses show it and no correction ever lands there
    g = np.random.default_rng(3)
    case = Case(g, sparse=False, adversarial=False)
    lay = SPLITS[1]  # rank 1 holds the one id 30
    lo, hi = lay.bounds[1]
    ql = np.full((D, V), -30.0)
    ql[:, lo] = 3.0  # q(30) ~ 1 >> p(30): no residual on rank 1
    case.rows = [build_row(ql[i]) for i in range(D)]
    case.q_dense = dense_counts(from_rows(case.rows))
    case.drafts = [lo] * D
    masses = []

    def watch(reqs):
        if isinstance(reqs[0], Gather) and reqs[0].t.dtype == torch.int64:
            masses.append([int(r.t[0]) for r in reqs])  # each rank's residual mass
        return deliver(reqs)
    corrections = 0
    for k in range(300):
        masses.clear()
        acc, tok, _ = round_on(lay, case, RoundKeys(k, 1, k, 0), collective=watch)
        if acc < D:
            corrections += 1
            assert not lo <= tok < hi
            assert masses[0][1] == 0 and masses[0][0] > 0 and masses[0][2] > 0
    assert corrections > 250


def local_normaliser(reqs, every=False):
    """Planted bug: the last rank (or ``every`` rank) normalises its shard alone: it
    receives its own limb sum (the first Sum of a step, shape [n, 2]), not the total."""
    out = deliver(reqs)
    if isinstance(reqs[0], Sum) and reqs[0].t.dim() == 2:
        for r in range(len(reqs)) if every else [len(reqs) - 1]:
            out[r] = reqs[r].t.clone()
    return out


@pytest.mark.experiment
def test_first_token_is_distributed_as_target_only_and_a_local_normaliser_is_caught():
    # the narrow regime of ANCHORS (vocab tens of ids, q = the target's negated logits:
    # heavy rejection); drafts drawn afresh from q each round, so the first token a round
    # emits (x_1 accepted, else the correction) has the target-only law p.
    g = np.random.default_rng(5)
    case = Case(g, sparse=False, adversarial=True)
    lay = SPLITS[1]
    n = 1500  # the planted bug moves ~1/3 of the mass: rejected by far at this size
    good, bad = np.zeros(V, np.int64), np.zeros(V, np.int64)
    for k in range(n):
        seed = 1000 + k
        case.drafts = [sample(r, proposal_u24(seed, 1, k, 7 + i)) for i, r in
                       enumerate(case.rows)]
        keys = RoundKeys(seed ^ 0x9E3779B97F4A7C15, 1, k, 7)
        acc, tok, _ = round_on(lay, case, keys)
        good[case.drafts[0] if acc > 0 else tok] += 1
        acc, tok, _ = round_on(lay, case, keys, collective=local_normaliser)
        bad[case.drafts[0] if acc > 0 else tok] += 1
    p = case.p[0].numpy()
    fit = g_test(good, p)
    assert not fit.rejected, fit
    planted = g_test(bad, p)
    assert planted.rejected, planted
    # every rank normalising alone: the row sums to ~N, refused by the S bound (>= 2)
    with pytest.raises(DistributionError) as e:
        round_on(lay, case, keys, collective=lambda r: local_normaliser(r, every=True))
    assert e.value.reason is Reason.WRONG_MASS


def test_ranks_refuse_together():
    case = cases(n=1)[0]
    bad = case.logits.clone()
    bad[1, 40] = float("nan")  # one rank's shard only
    case.logits = bad
    with pytest.raises(DistributionError) as e:
        round_on(SPLITS[0], case, RoundKeys(1, 1, 1, 1))
    assert e.value.reason is Reason.NAN_LOGIT
    case = cases(n=1)[0]
    case.sparse = False
    case.q_dense = case.q_dense.clone()
    case.q_dense[0, case.drafts[0]] = 0  # the owner alone sees q = 0 at the draft
    with pytest.raises(LocalProtocolError) as e:
        round_on(SPLITS[1], case, RoundKeys(1, 1, 1, 1))
    assert e.value.reason is Reason.ZERO_Q_AT_TOKEN


PROCESSORS = [  # (temperature, top_k, top_p): each alone, both, at T = 1 and T = 0.7
    {"top_k": 5}, {"top_p": 0.8}, {"top_k": 12, "top_p": 0.6},
    {"temperature": 0.7, "top_k": 3}, {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 0.7, "top_k": 20, "top_p": 0.95}]


def kept_rows(case: Case, proc: dict) -> torch.Tensor:
    """The case's fixed-point rows after ``proc`` by the one-process rule (full sort)."""
    logits = case.logits / proc.get("temperature", 1.0)
    P = to_fixed(simulate(ONE.bounds, lambda pl: ss.probs(pl, logits))[0])
    out = torch.zeros_like(P)
    for r in range(P.shape[0]):
        ids = ref.processed_kept(P[r].tolist(), proc.get("top_k"), proc.get("top_p"))
        out[r, ids] = P[r, ids]
    return out


@pytest.mark.parametrize("proc", PROCESSORS)
def test_processed_rounds_decide_as_one_rank_the_kernels_and_the_oracle(proc):
    kr = KernelRounds()
    pool = cases(seed=13, n=8)
    for c in pool[::2]:  # ties at every boundary in half the targets (sparse and dense q)
        c.logits = torch.round(c.logits * 2) / 2
    for k in range(48):
        case, keys = pool[k % len(pool)], round_keys(k)
        P = kept_rows(case, proc)
        p = (P.double() / float(1 << 61)).numpy()  # exact: P has <= 53 significant bits
        if k % 8 == 7:
            u = target_only_draw(keys, keys.first_position)
            want = int(kr.target_only(p[0], keys, keys.first_position).token)
            assert [target_only_on(lay, case, u, proc) for lay in [ONE, *SPLITS]] == [want] * 3
            continue
        want = kr.sampled([p], [case.rows], [case.drafts], [keys])[0]
        got = {round_on(lay, case, keys, proc)[:2] for lay in [ONE, *SPLITS]}
        assert got == {(want.accepted, want.token)}, (k, want, got)
        if k % 4 == 0:
            rows = [{i: int(v) for i, v in enumerate(r.tolist()) if v} for r in P]
            oracle = ref.oracle_round([ref.exact_dist(r, V) for r in rows], case.rows,
                                      case.drafts, ref.RoundDraws.from_keys(keys, D))
            assert (want.accepted, want.token) == (oracle.accepted, oracle.token)
