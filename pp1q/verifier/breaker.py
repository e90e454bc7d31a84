"""The worker link's circuit breaker, sans-IO: a state table, a clock passed in.

A worker that hangs with its connection open costs one watchdog deadline per token,
without limit. After ``after_timeouts`` consecutive watchdog fallbacks the circuit
opens: for ``open_s`` no STEP is sent and every round is target-only at once (exact, as
any fallback). Then it is half-open: the next round is a probe, sent alone; its success
closes the circuit, its timeout opens it again for twice as long (up to ``open_max_s``),
any other end of the probe (a refusal, a lost connection, its request gone) lets the
next round probe again. A proposal that arrives (ProposalReady) resets the count of
consecutive timeouts; other failures neither count nor reset (they cost no waiting).

The link reports outcomes (``Outcome``) and asks ``permit(now)`` before each STEP; the
scheduler asks ``blocks(now)`` before it sends anything for a round. Every change of
state is a row of ``TRANSITIONS``; nothing else assigns ``state``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class State(enum.IntEnum):
    """The gauge's values (pp1q_circuit_state)."""

    CLOSED = 0  # speculating
    OPEN = 1  # target-only until the open period ends
    HALF_OPEN = 2  # the next round may probe
    PROBING = 3  # one probe in flight; every other round target-only


class Event(enum.StrEnum):
    TRIP = "trip"  # consecutive watchdog fallbacks reached the bound
    EXPIRE = "expire"  # the open period ended
    PROBE = "probe"  # a round was let through as the probe
    PROBE_OK = "probe_ok"
    PROBE_TIMEOUT = "probe_timeout"
    PROBE_OTHER = "probe_other"  # the probe ended otherwise: refused, lost, abandoned


# (state, event) -> next state; a pair not listed leaves the state as it is
TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.CLOSED, Event.TRIP): State.OPEN,
    (State.OPEN, Event.EXPIRE): State.HALF_OPEN,
    (State.HALF_OPEN, Event.PROBE): State.PROBING,
    (State.PROBING, Event.PROBE_OK): State.CLOSED,
    (State.PROBING, Event.PROBE_TIMEOUT): State.OPEN,
    (State.PROBING, Event.PROBE_OTHER): State.HALF_OPEN,
}


class Outcome(enum.StrEnum):
    """How a STEP the breaker permitted ended."""

    SUCCESS = "success"
    TIMEOUT = "timeout"
    OTHER = "other"  # refused, invalid, lost, or never sent / abandoned


@dataclass(frozen=True)
class BreakerConfig:
    after_timeouts: int = 8  # consecutive watchdog fallbacks that open the circuit
    open_s: float = 5.0  # first open period
    open_max_s: float = 60.0  # the doubling stops here


DEFAULT_BREAKER = BreakerConfig()


class Breaker:
    def __init__(self, config: BreakerConfig = DEFAULT_BREAKER) -> None:
        self.config = config
        self.state = State.CLOSED
        self.timeouts = 0  # consecutive watchdog fallbacks while closed
        self.open_for = config.open_s  # the next open period
        self.until = 0.0  # end of the current open period (OPEN only)
        self.trips = 0  # times the circuit opened (a metric's source)

    def _apply(self, event: Event, now: float) -> None:
        nxt = TRANSITIONS.get((self.state, event))
        if nxt is None:
            return
        if nxt is State.OPEN:
            self.trips += 1
            self.until = now + self.open_for
            self.open_for = min(self.open_for * 2, self.config.open_max_s)
        elif nxt is State.CLOSED:
            self.timeouts, self.open_for = 0, self.config.open_s
        self.state = nxt

    def _expire(self, now: float) -> None:
        if self.state is State.OPEN and now >= self.until:
            self._apply(Event.EXPIRE, now)

    def blocks(self, now: float) -> bool:
        """No round may speculate now (the scheduler asks before sending anything)."""
        self._expire(now)
        return self.state in (State.OPEN, State.PROBING)

    def permit(self, now: float) -> bool | None:
        """May a STEP go now? None: no; False: yes; True: yes, as the probe."""
        self._expire(now)
        if self.state is State.CLOSED:
            return False
        if self.state is State.HALF_OPEN:
            self._apply(Event.PROBE, now)
            return True
        return None

    def record(self, outcome: Outcome, probe: bool, now: float) -> None:
        """A permitted STEP ended with ``outcome`` (``probe``: it was the probe)."""
        if probe:
            self._apply({Outcome.SUCCESS: Event.PROBE_OK, Outcome.TIMEOUT: Event.PROBE_TIMEOUT,
                         Outcome.OTHER: Event.PROBE_OTHER}[outcome], now)
        elif outcome is Outcome.SUCCESS:
            if self.state is State.CLOSED:
                self.timeouts = 0
        elif outcome is Outcome.TIMEOUT and self.state is State.CLOSED:
            self.timeouts += 1
            if self.timeouts >= self.config.after_timeouts:
                self._apply(Event.TRIP, now)

    @property
    def name(self) -> str:
        return self.state.name.lower()
