"""The circuit breaker's state table with a fake clock (pp1q.verifier.breaker)."""

from __future__ import annotations

import pytest

from pp1q.verifier.breaker import TRANSITIONS, Breaker, BreakerConfig, Event, Outcome, State

K = 3
CFG = BreakerConfig(after_timeouts=K, open_s=5.0, open_max_s=12.0)


def tripped(now: float = 0.0) -> Breaker:
    b = Breaker(CFG)
    for _ in range(K):
        assert b.permit(now) is False
        b.record(Outcome.TIMEOUT, False, now)
    assert b.state is State.OPEN
    return b


def test_k_consecutive_timeouts_open_it_and_a_success_in_between_resets_the_count():
    b = Breaker(CFG)
    for _ in range(K - 1):
        b.record(Outcome.TIMEOUT, False, 0.0)
    b.record(Outcome.SUCCESS, False, 0.0)
    for _ in range(K - 1):
        b.record(Outcome.TIMEOUT, False, 0.0)
    b.record(Outcome.OTHER, False, 0.0)  # a refusal neither counts nor resets
    assert b.state is State.CLOSED and not b.blocks(0.0)
    b.record(Outcome.TIMEOUT, False, 1.0)
    assert b.state is State.OPEN and b.trips == 1


def test_open_blocks_until_the_period_ends_then_one_probe_goes_alone():
    b = tripped(now=10.0)
    assert b.blocks(14.9) and b.permit(14.9) is None
    assert not b.blocks(15.0)  # half-open: the next round may probe
    assert b.permit(15.0) is True  # the probe
    assert b.blocks(15.0) and b.permit(15.0) is None  # others wait for its outcome
    b.record(Outcome.SUCCESS, True, 15.5)
    assert b.state is State.CLOSED and b.permit(15.5) is False and b.timeouts == 0


def test_a_probe_that_times_out_reopens_for_twice_as_long_up_to_the_cap():
    b = tripped(now=0.0)
    assert b.until == 5.0
    lengths = []
    for _ in range(4):
        now = b.until
        assert b.permit(now) is True
        b.record(Outcome.TIMEOUT, True, now)
        lengths.append(b.until - now)
    assert lengths == [10.0, 12.0, 12.0, 12.0]
    assert b.trips == 5
    assert b.permit(b.until) is True
    b.record(Outcome.SUCCESS, True, b.until)
    assert b.state is State.CLOSED and b.open_for == CFG.open_s  # the doubling starts over


def test_a_probe_that_ends_otherwise_lets_the_next_round_probe():
    b = tripped()
    assert b.permit(5.0) is True
    b.record(Outcome.OTHER, True, 5.0)  # refused, lost, or its request went away
    assert b.state is State.HALF_OPEN and b.permit(5.0) is True


def test_late_outcomes_of_older_steps_do_not_move_an_open_circuit():
    b = tripped()
    b.record(Outcome.SUCCESS, False, 1.0)
    b.record(Outcome.TIMEOUT, False, 1.0)
    assert b.state is State.OPEN and b.trips == 1 and b.until == CFG.open_s


@pytest.mark.parametrize("state", list(State))
def test_every_state_has_a_way_out(state):
    assert any(s is state for s, _e in TRANSITIONS)
    assert all(isinstance(e, Event) for _s, e in TRANSITIONS)
