"""The breaker's adapter on the worker link: it reads the loop's clock, maps each
permitted STEP's end to a breaker outcome, and publishes the state (a gauge, a counter
of trips, a log line when it opens or closes). The decisions are pp1q.verifier.breaker's. It also
keeps the run of consecutive failed proposals /healthz reports (a worker refusing every
step: no waiting, so no trip, but no speculation either)."""

from __future__ import annotations

import asyncio
import logging

from pp1q.core.outcomes import FallbackCause
from pp1q.runtime.metrics import Metrics
from pp1q.verifier.breaker import Breaker, Outcome, State
from pp1q.verifier.outcome import Fallback
from pp1q.wire.events import ProposalReady

log = logging.getLogger("pp1q.verifier")


class Circuit:
    def __init__(self, breaker: Breaker, metrics: Metrics) -> None:
        self.breaker, self.metrics = breaker, metrics
        self._published = (breaker.state, 0)  # (state, trips) the metrics show
        self.failing = 0  # consecutive permitted STEPs that ended without a proposal
        self.last_failure: str | None = None  # the last one's fallback cause

    def blocks(self, now: float) -> bool:
        blocked = self.breaker.blocks(now)
        self._publish(now)
        return blocked

    def permit(self, now: float) -> bool | None:
        probe = self.breaker.permit(now)
        self._publish(now)
        return probe

    def step_ended(self, probe: bool, fut: asyncio.Future) -> None:
        """A permitted STEP's future resolved (a done callback). A cancelled one: its
        request went away, which proves nothing about the worker."""
        out = None if fut.cancelled() else fut.result()
        if isinstance(out, Fallback):
            self.failing += 1
            self.last_failure = out.cause.value
        elif out is not None:
            self.failing = 0
        if isinstance(out, ProposalReady):
            outcome = Outcome.SUCCESS
        elif isinstance(out, Fallback) and out.cause is FallbackCause.WATCHDOG_TIMEOUT:
            outcome = Outcome.TIMEOUT
        else:
            outcome = Outcome.OTHER
        now = asyncio.get_running_loop().time()
        self.breaker.record(outcome, probe, now)
        self._publish(now)

    def _publish(self, now: float) -> None:
        b, m = self.breaker, self.metrics
        _was, counted = self._published
        if (b.state, b.trips) == self._published:
            return
        self._published = (b.state, b.trips)
        m.circuit_state.set(int(b.state))
        if b.trips > counted:
            m.circuit_trips.inc(b.trips - counted)
            log.warning("circuit open after %d consecutive watchdog timeouts (or a failed "
                        "probe): target-only for %.3g s", b.config.after_timeouts, b.until - now)
        elif b.state is State.CLOSED:
            log.info("circuit closed: the probe round succeeded; speculating again")
