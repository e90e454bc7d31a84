"""The worker link against an in-process worker: a connection-level REFUSAL (slot -1)
mid-session closes the connection and the link reconnects with backoff, counted, without
an ERROR line per token while it is down (docs/wire.md: such a REFUSAL closes the
connection)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fake_worker import FakeWorker
from wire_helpers import config
from wire_vectors import LIMITS

from pp1q.core.errors import Reason
from pp1q.core.outcomes import FallbackCause
from pp1q.core.prefix import Prefix
from pp1q.runtime.metrics import Metrics
from pp1q.verifier.link import Fallback, Needs, WorkerLink
from pp1q.wire import Step

pytestmark = pytest.mark.daemons  # binds a server on 127.0.0.1

WAIT_S = 20.0  # bound on every wait below; the loopback steps take milliseconds
PROMPT = [1, 2, 3]


def make_link(port: int, metrics: Metrics | None = None, step_timeout: float = 5.0,
              **kw) -> WorkerLink:
    return WorkerLink("127.0.0.1", port, config(versions=(2,)),
                      Needs(slots=LIMITS.max_slots, depth=3, support=4),
                      metrics or Metrics("verifier"), step_timeout, 0.2, **kw)


def step_for(link: WorkerLink, slot: int = 0, generation: int = 1, round_id: int = 1) -> Step:
    prefix = Prefix(PROMPT)
    assert link.send_context(slot, generation, prefix, 0)
    return Step(session=link.session, slot=slot, generation=generation, round_id=round_id,
                last_committed=len(PROMPT) - 1, first_position=len(PROMPT),
                prefix_digest=prefix.digest, depth=3, temperature=0.8, top_k=0,
                context_version=0, seed=11)


async def until(predicate, what: str) -> None:
    async with asyncio.timeout(WAIT_S):
        while not predicate():
            await asyncio.sleep(0.01)
    assert predicate(), what


async def test_a_connection_refusal_closes_and_reconnects_counted(caplog):
    worker = FakeWorker()
    await worker.start()
    metrics = Metrics("verifier")
    link = make_link(worker.port, metrics)
    stop = asyncio.Event()
    task = asyncio.create_task(link.run(stop))
    try:
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
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)
        await worker.close()


async def test_a_refused_step_in_flight_fails_as_refused_not_as_a_broken_stream():
    worker = FakeWorker(mode="hang")
    await worker.start()
    link = make_link(worker.port)
    stop = asyncio.Event()
    task = asyncio.create_task(link.run(stop))
    try:
        assert await link.wait_ready(WAIT_S)
        pending = link.propose(step_for(link))
        await until(lambda: worker.steps, "the STEP never arrived")
        worker.refuse_connection()
        out = await asyncio.wait_for(pending, WAIT_S)
        assert isinstance(out, Fallback) and out.cause is FallbackCause.WORKER_REFUSED
        assert out.reason is Reason.PEER_REFUSED
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)
        await worker.close()


async def test_a_bad_frame_right_after_the_hello_answer_counts_its_own_reason():
    # issue 16: the worker's HELLO answer and a corrupt frame in one read were counted as
    # a refused HELLO (peers_refused hello_incompatible); the answer was fine, the frame
    # after it is what failed, and only that is counted
    worker = FakeWorker(after_hello=b"\xff" * 64)  # no frame starts with these bytes
    await worker.start()
    metrics = Metrics("verifier")
    link = make_link(worker.port, metrics)
    stop = asyncio.Event()
    task = asyncio.create_task(link.run(stop))
    try:
        await until(lambda: worker.hellos >= 1 and sample(metrics, "validation_failures") > 0,
                    "the corrupt frame after the HELLO answer was not refused")
        assert sample(metrics, "peers_refused") == 0
        assert link.refused is None  # the session was not refused at HELLO
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)
        await worker.close()


def sample(metrics: Metrics, family: str) -> float:
    """The sum over labels of one counter family."""
    total = 0.0
    for metric in getattr(metrics, family).collect():
        total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total
