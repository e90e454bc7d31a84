"""The circuit breaker in service: a worker that hangs with its connection open costs K
watchdog deadlines, then requests are served target-only without sending a STEP or
waiting, counted; after the open period one probe round goes, and its success closes the
circuit (the link and scheduler against an in-process worker)."""

from __future__ import annotations

import asyncio

import pytest
from fake_decider import FakeDecider
from fake_worker import FakeWorker
from link_harness import WAIT_S, linked, until

from pp1q.core.errors import Reason
from pp1q.core.outcomes import FallbackCause
from pp1q.runtime.metrics import Metrics
from pp1q.verifier.api import GenerateRequest
from pp1q.verifier.breaker import BreakerConfig, Outcome, State
from pp1q.verifier.scheduler import Scheduler

pytestmark = pytest.mark.daemons  # binds a server on 127.0.0.1

K = 3
WATCHDOG_S = 0.05  # a short deadline: the hung STEPs fail fast


def request(max_tokens: int) -> GenerateRequest:
    return GenerateRequest(prompt=[1, 2, 3], max_tokens=max_tokens, seed=5, speculative=True,
                           greedy=True, draft_temperature=1.0, top_k=None)


async def test_k_watchdog_fallbacks_open_the_circuit_and_a_probe_closes_it():
    worker = FakeWorker(mode="hang")
    metrics = Metrics("verifier")
    breaker = BreakerConfig(after_timeouts=K, open_s=3600.0, open_max_s=3600.0)
    async with linked(worker, metrics, step_timeout=WATCHDOG_S, breaker=breaker) as link:
        scheduler = Scheduler(link, FakeDecider(), metrics, slots=1, depth=3)
        assert await link.wait_ready(WAIT_S)
        answer = await asyncio.wait_for(scheduler.generate(request(20)), WAIT_S)
        assert len(answer["token_ids"]) == 20
        fallbacks = answer["stats"]["fallbacks"]
        assert len(worker.steps) == K  # K STEPs hung, then none was sent
        assert fallbacks[FallbackCause.WATCHDOG_TIMEOUT.value] == K
        assert fallbacks[FallbackCause.CIRCUIT_OPEN.value] == 20 - K
        assert metrics.value("pp1q_watchdog_timeouts_total") == K
        # each timed-out STEP was invalidated (RESET) and counted; the circuit's rounds
        # sent nothing, so nothing of theirs is
        assert metrics.value("pp1q_generation_invalidations_total") == K
        # the last RESETs leave with the tick's one write: wait until the worker read them
        await until(lambda: len(worker.resets) >= K + 1, "the RESETs reached the worker")
        assert [r.reason for r in worker.resets] == [Reason.STEP_TIMEOUT] * K + [
            Reason.CANCELLED]  # and the release's, which is not an invalidation
        assert metrics.value("pp1q_circuit_trips_total") == 1
        assert metrics.value("pp1q_circuit_state") == State.OPEN
        assert link.ready  # the connection itself is fine: only speculation stopped
        assert link.health() == {"worker": "degraded", "cause": "circuit_open",
                                 "detail": "open"}

        # the worker recovers; once the open period is over one probe goes and closes it
        worker.mode = "answer"
        link.circuit.breaker.until = 0.0  # the clock is the breaker's input: end the period now
        answer = await asyncio.wait_for(scheduler.generate(request(8)), WAIT_S)
        assert len(worker.steps) > K and answer["stats"]["rounds"] >= 1
        assert metrics.value("pp1q_circuit_state") == State.CLOSED
        assert link.health()["worker"] == "connected"
        assert metrics.value("pp1q_circuit_trips_total") == 1


async def test_a_probe_whose_request_goes_away_lets_the_next_round_probe():
    worker = FakeWorker(mode="hang")
    metrics = Metrics("verifier")
    breaker = BreakerConfig(after_timeouts=1, open_s=3600.0, open_max_s=3600.0)
    async with linked(worker, metrics, step_timeout=3600.0, breaker=breaker) as link:
        scheduler = Scheduler(link, FakeDecider(), metrics, slots=1, depth=3)
        assert await link.wait_ready(WAIT_S)
        # open the circuit through its input, then end the period: the next STEP probes
        link.circuit.breaker.record(Outcome.TIMEOUT, False, 0.0)
        link.circuit.breaker.until = 0.0
        gone = asyncio.create_task(scheduler.generate(request(4)))
        await until(lambda: worker.steps, "the probe never left")
        assert link.circuit.breaker.state is State.PROBING
        gone.cancel()  # its client went away: the probe proves nothing
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert link.circuit.breaker.state is State.HALF_OPEN
