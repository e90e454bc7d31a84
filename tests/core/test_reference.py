"""The rational oracle against hand-computed exact cases."""

from fractions import Fraction as F

import numpy as np
import pytest

from pp1q.core.errors import DistributionError, LocalProtocolError, Reason
from pp1q.core.q import MASS, DyadicRow, build_row
from pp1q.core.reference import (
    ExactDist,
    RoundDraws,
    exact_accepts,
    exact_dist,
    exact_from_fp32,
    exact_pick,
    from_dyadic,
    oracle_round,
    oracle_target_only,
    residual,
)
from pp1q.core.rng import Domain, uniform53
from pp1q.core.verify import RoundDecision, RoundKeys

HALF = 1 << 52  # u53 / 2^53 = 1/2


def test_full_and_sparse_weights_normalise_exactly():
    full = exact_dist([F(1, 3), 0, F(2, 3), 1])
    assert full.probs() == [F(1, 6), 0, F(1, 3), F(1, 2)]
    sparse = exact_dist({3: 1, 0: F(1, 3), 2: F(2, 3)}, vocab=4)
    assert sparse == full
    assert exact_dist(([3, 0, 2], [1.0, 1 / 3, 2 / 3]), vocab=4).prob(1) == 0


def test_floats_are_taken_exactly_not_rounded():
    d = exact_dist([0.1, 0.3])
    assert d.prob(0) == F(0.1) / (F(0.1) + F(0.3))  # the float64 values, not 1/4
    assert d.prob(0) != F(1, 4)


def test_fp32_helper_rounds_first_then_normalises_exactly():
    w = [0.1, 0.2, 0.7]
    d = exact_from_fp32(w)
    r = [F(float(np.float32(x))) for x in w]
    assert d.probs() == [x / sum(r) for x in r]
    assert d != exact_dist(w)  # the FP32 rounding is really applied
    assert exact_from_fp32({0: 0.1, 2: 0.7}, vocab=3).prob(2) == r[2] / (r[0] + r[2])


@pytest.mark.parametrize("weights,reason", [
    ([0, 0], Reason.ZERO_MASS),
    ([1, -1, 1], Reason.NEGATIVE_VALUE),
    ([1.0, float("nan")], Reason.NON_FINITE),
    ([1.0, float("inf")], Reason.NON_FINITE),
])
def test_bad_weights_refused(weights, reason):
    with pytest.raises(DistributionError) as e:
        exact_dist(weights)
    assert e.value.reason == reason


def test_sparse_weights_need_valid_ids():
    with pytest.raises(DistributionError) as e:
        exact_dist({5: 1}, vocab=4)
    assert e.value.reason == Reason.ID_OUT_OF_RANGE
    with pytest.raises(DistributionError):
        exact_dist({0: 1})  # no vocab


def test_dyadic_row_is_counts_over_mass():
    row = build_row(np.array([0.0, 1.0, -np.inf]))
    d = from_dyadic(row)
    assert d.total == MASS and d.prob(2) == 0 and d.prob(1) == F(row.count_of(1), MASS)
    assert exact_dist(row) == d


def test_pick_strict_boundaries_and_zero_weight():
    d = exact_dist([0, F(1, 2), 0, F(1, 2), 0])
    assert exact_pick(d, 0) == 1  # a zero-weight id 0 is never picked, even with u = 0
    assert exact_pick(d, HALF - 1) == 1
    assert exact_pick(d, HALF) == 3  # C_1 = 1/2 is not > 1/2: equality moves on
    assert exact_pick(d, (1 << 53) - 1) == 3  # never the zero-weight tail (id < vocab)
    with pytest.raises(DistributionError):
        exact_pick(d, 1 << 53)


def test_accept_is_strict_and_never_accepts_zero_target_mass():
    assert not exact_accepts(0, F(0), F(1, 2))  # u = 0 and p = 0: rejected
    assert exact_accepts(0, F(1, 10**9), F(1, 2))
    assert not exact_accepts(HALF, F(1, 4), F(1, 2))  # U = ratio exactly: rejected
    assert exact_accepts(HALF - 1, F(1, 4), F(1, 2))
    assert exact_accepts((1 << 53) - 1, F(1, 2), F(1, 2))  # p = q: always accepted
    with pytest.raises(LocalProtocolError):
        exact_accepts(0, F(1, 2), F(0))


def test_residual_covers_the_full_vocabulary():
    p = exact_dist([F(1, 2), F(1, 4), F(1, 4)])
    q = exact_dist({0: 1}, vocab=3)  # sparse q, support {0}
    r = residual(p, q)
    assert r.probs() == [0, F(1, 2), F(1, 2)]  # tokens outside the support count
    assert residual(p, p) is None


def _row(counts: dict[int, int], vocab: int) -> DyadicRow:
    ids = sorted(counts)
    return DyadicRow(vocab=vocab, ids=np.array(ids), counts=np.array([counts[i] for i in ids]))


def test_round_hand_computed():
    # position 1: p = (1/2, 1/2, 0), q = (1/4, 3/4): x = 1, ratio (1/2)/(3/4) = 2/3.
    q1 = _row({0: MASS // 4, 1: 3 * MASS // 4}, 3)
    p = [[F(1, 2), F(1, 2), 0], [0, 0, 1], [F(1, 3), F(1, 3), F(1, 3)]]
    q2 = _row({2: MASS}, 3)
    u_accept = (2 << 53) // 3  # just below 2/3
    u_reject = u_accept + 1
    # residual at 1: max(p - q, 0) = (1/4, 0, 0) -> always token 0
    d = oracle_round(p, [q1, q2], [1, 2], RoundDraws((u_reject, 0), (123, 0), 0))
    assert d == RoundDecision(0, 0, "correction")
    # accepted at 1, then q2 = p2 at token 2: accepted; bonus from p3 with U = 1/2 -> id 1
    d = oracle_round(p, [q1, q2], [1, 2], RoundDraws((u_accept, 5), (0, 0), HALF))
    assert d == RoundDecision(2, 1, "bonus")


def test_round_draws_from_keys_follow_the_contract():
    k = RoundKeys(seed=7, generation=3, round_id=11, first_position=100)
    d = RoundDraws.from_keys(k, 2)
    assert d.acceptance == tuple(uniform53(7, 3, 11, 100 + i, Domain.ACCEPTANCE) for i in (0, 1))
    assert d.correction == tuple(uniform53(7, 3, 11, 100 + i, Domain.CORRECTION) for i in (0, 1))
    assert d.bonus == uniform53(7, 3, 11, 102, Domain.BONUS)
    assert len(set(d.acceptance + d.correction + (d.bonus,))) == 5


def test_target_only_normalises_p_exactly():
    # unnormalised weights (2, 2): U = 1/2 is exactly on C_0 = 1/2, so id 1
    assert oracle_target_only([2, 2], HALF) == 1
    assert oracle_target_only([2, 2], HALF - 1) == 0


def test_exact_dist_is_reduced():
    d = exact_dist([2, 4])
    assert isinstance(d, ExactDist) and (d.nums, d.total) == ((1, 2), 3)
