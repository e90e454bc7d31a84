"""The worker link against an in-process worker: a connection-level REFUSAL (slot -1)
mid-session closes the connection and the link reconnects with backoff, counted, without
an ERROR line per token while it is down (docs/wire.md: such a REFUSAL closes the
connection)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fake_worker import FakeWorker
from link_harness import PROMPT, WAIT_S, linked, step_for, until

from pp1q.core.errors import Reason
from pp1q.core.outcomes import FallbackCause
from pp1q.core.prefix import Prefix
from pp1q.runtime.metrics import Metrics
from pp1q.verifier.link import Fallback
from pp1q.wire import Step

pytestmark = pytest.mark.daemons  # binds a server on 127.0.0.1

async def test_a_connection_refusal_closes_and_reconnects_counted(caplog):
    worker = FakeWorker()
    metrics = Metrics("verifier")
    async with linked(worker, metrics) as link:
        assert await link.wait_ready(WAIT_S)
        first = link.session
        ready = await link.propose(step_for(link))
        assert not isinstance(ready, Fallback)  # the session works before the refusal
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pp1q.verifier"):
            worker.refuse_connection()
            await until(lambda: not link.ready, "the refused session is not ready")
            # while down, every token falls back at once (one loop tick: no reconnect in
            # between), without a log line each
            dead = Step(session=first, slot=0, generation=2, round_id=1, last_committed=2,
                        first_position=3, prefix_digest=0, depth=3, temperature=0.8, top_k=0,
                        context_version=0, seed=11)
            for _ in range(5):
                assert not link.send_context(0, 2, Prefix(PROMPT), 0)
                out = await link.propose(dead)
                assert isinstance(out, Fallback)
                assert out.cause is FallbackCause.WORKER_UNAVAILABLE
            await until(lambda: link.ready and link.session != first, "no new session")
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) <= 1, [r.getMessage() for r in errors]  # the refusal, once
        assert worker.hellos == 2
        assert metrics.value("pp1q_reconnects_total") == 1
        assert metrics.value("pp1q_validation_failures_total",
                             reason=Reason.PEER_REFUSED.value) == 1
        ready = await link.propose(step_for(link, generation=3))
        assert not isinstance(ready, Fallback)  # and the new session speculates


async def test_a_refused_step_in_flight_fails_as_refused_not_as_a_broken_stream():
    worker = FakeWorker(mode="hang")
    async with linked(worker) as link:
        assert await link.wait_ready(WAIT_S)
        pending = link.propose(step_for(link))
        await until(lambda: worker.steps, "the STEP never arrived")
        worker.refuse_connection()
        out = await asyncio.wait_for(pending, WAIT_S)
        assert isinstance(out, Fallback) and out.cause is FallbackCause.WORKER_REFUSED
        assert out.reason is Reason.PEER_REFUSED


async def test_a_bad_frame_right_after_the_hello_answer_counts_its_own_reason():
    # issue 16: the worker's HELLO answer and a corrupt frame in one read were counted as
    # a refused HELLO (peers_refused hello_incompatible); the answer was fine, the frame
    # after it is what failed, and only that is counted
    worker = FakeWorker(after_hello=b"\xff" * 64)  # no frame starts with these bytes
    metrics = Metrics("verifier")
    async with linked(worker, metrics) as link:
        await until(lambda: worker.hellos >= 1 and sample(metrics, "validation_failures") > 0,
                    "the corrupt frame after the HELLO answer was not refused")
        assert sample(metrics, "peers_refused") == 0
        assert link.refused is None  # the session was not refused at HELLO


def sample(metrics: Metrics, family: str) -> float:
    """The sum over labels of one counter family."""
    total = 0.0
    for metric in getattr(metrics, family).collect():
        total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total
