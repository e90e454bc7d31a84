"""Depth admission: decided before sampling; the selection-bias regression (issue 2 §6)."""

from fractions import Fraction as F

import numpy as np
import pytest

from pp1q.core.admission import SHIPPED_POLICIES, AdmissionView, FixedDepth, draft_chain
from pp1q.core.errors import LocalProtocolError
from pp1q.core.q import build_row
from pp1q.core.reference import exact_dist, from_dyadic, residual

# The toy of the seed: q = p uniform over 2 tokens (exactly: 2^23 counts each).
Q_ROW = build_row(np.zeros(2))
Q = from_dyadic(Q_ROW)
P = exact_dist([F(1, 2), F(1, 2)])
assert Q.probs() == P.probs()


def _verified_law(p, q, x: int) -> dict[int, F]:
    """Exact law of the first output token when x is drafted and verified."""
    a = min(F(1), p.prob(x) / q.prob(x))
    law = {v: F(0) for v in range(p.vocab)}
    law[x] += a
    r = residual(p, q)
    if r is not None:
        for v, pr in enumerate(r.probs()):
            law[v] += (1 - a) * pr
    return law


def _first_token_mass(admitted_after_seeing) -> F:
    """P(first output = 0): draft x ~ q; verify if admitted, else target-only from p."""
    mass = F(0)
    for x in range(2):
        law = _verified_law(P, Q, x) if admitted_after_seeing(x) else dict(enumerate(P.probs()))
        mass += Q.prob(x) * law[0]
    return mass


def _through_interface(policy, committed=(), load=None) -> F:
    """P(first output = 0) when position 1 is admitted through ``draft_chain``."""
    mass = F(0)
    for x in range(2):  # every possible proposal draw, weighted by q
        chain = draft_chain(policy, max_depth=1, propose=lambda i, prev, x=x: x,
                            committed=committed, measure_load=load)
        law = _verified_law(P, Q, x) if chain else dict(enumerate(P.probs()))
        mass += Q.prob(x) * law[0]
    return mass


def test_fixed_depth_path_keeps_token0_mass_one_half():
    assert _first_token_mass(lambda x: True) == F(1, 2)
    assert _through_interface(FixedDepth(1)) == F(1, 2)


def test_selective_admission_of_the_first_draw_gives_three_quarters():
    # Admit x_1 only when it is token 0, otherwise resample target-only: the seed's
    # counterexample. The verifier is exact, yet the output is biased.
    assert _first_token_mass(lambda x: x == 0) == F(3, 4)


class _LoadGate:
    name = "load-gate"

    def admit(self, view: AdmissionView) -> bool:
        return view.load is None or view.load < 0.5


class _HistoryGate:
    name = "history-gate"

    def admit(self, view: AdmissionView) -> bool:
        return sum(view.committed) % 2 == 0


@pytest.mark.parametrize("policy,kw", [
    (_LoadGate(), {"load": lambda: 0.9}),
    (_LoadGate(), {"load": lambda: 0.1}),
    (_HistoryGate(), {"committed": (1, 2)}),
    (_HistoryGate(), {"committed": (1, 3)}),
])
def test_any_policy_deciding_before_the_draw_is_unbiased(policy, kw):
    # Whatever it admits, a decision made without x_1 cannot select on x_1.
    assert _through_interface(policy, **kw) == F(1, 2)


class _Recorder:
    name = "recorder"

    def __init__(self, verdicts):
        self.verdicts = list(verdicts)
        self.views = []

    def admit(self, view):
        self.views.append(view)
        return self.verdicts[len(self.views) - 1]


def test_view_holds_only_earlier_drafts_and_sampling_follows_admission():
    events = []
    rec = _Recorder([True, True, True])
    orig = rec.admit

    def admit(view):
        events.append(("admit", view.position))
        return orig(view)

    rec.admit = admit

    def propose(i, prev):
        events.append(("sample", i))
        return 10 + i

    chain = draft_chain(rec, max_depth=3, propose=propose, committed=[7, 8])
    assert chain == (11, 12, 13)
    assert [v.drafted for v in rec.views] == [(), (11,), (11, 12)]
    assert all(v.committed == (7, 8) for v in rec.views)
    assert events == [("admit", 1), ("sample", 1), ("admit", 2), ("sample", 2),
                      ("admit", 3), ("sample", 3)]


def test_stopped_prefix_never_reopens():
    rec = _Recorder([True, False, True, True])
    sampled = []
    chain = draft_chain(rec, max_depth=4, propose=lambda i, prev: sampled.append(i) or i)
    assert chain == (1,) and sampled == [1]
    assert len(rec.views) == 2  # position 3 is never even asked


def test_load_is_measured_before_each_decision():
    readings = iter([0.1, 0.2, 0.9])
    rec = _Recorder([True, True, True])
    draft_chain(rec, max_depth=3, propose=lambda i, p: 0, measure_load=lambda: next(readings))
    assert [v.load for v in rec.views] == [0.1, 0.2, 0.9]


def test_fixed_depth_is_the_only_shipped_policy():
    assert list(SHIPPED_POLICIES.items()) == [("fixed", FixedDepth)]
    assert draft_chain(FixedDepth(5), max_depth=8, propose=lambda i, p: i) == (1, 2, 3, 4, 5)
    assert draft_chain(FixedDepth(5), max_depth=3, propose=lambda i, p: i) == (1, 2, 3)


@pytest.mark.parametrize("depth", [0, -1, True, 2.0])
def test_bad_fixed_depth_refused(depth):
    with pytest.raises(LocalProtocolError):
        FixedDepth(depth)


def test_non_bool_verdict_refused():
    rec = _Recorder([1])
    with pytest.raises(LocalProtocolError):
        draft_chain(rec, max_depth=1, propose=lambda i, p: 0)
