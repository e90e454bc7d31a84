"""/healthz's view of the link (WorkerLink.health): "connected" only while rounds can
speculate; otherwise "disconnected" or "degraded" with the cause, against an in-process
worker."""

from __future__ import annotations

import asyncio

import pytest
from fake_worker import FakeWorker
from test_link_refusal import WAIT_S, make_link, step_for, until

from pp1q.verifier.link import DEGRADED_AFTER_FAILURES, Fallback

pytestmark = pytest.mark.daemons  # binds a server on 127.0.0.1


async def running(worker: FakeWorker, **kw):
    await worker.start()
    link = make_link(worker.port, **kw)
    stop = asyncio.Event()
    return link, stop, asyncio.create_task(link.run(stop))


async def finish(worker, stop, task) -> None:
    stop.set()
    await asyncio.wait_for(task, WAIT_S)
    await worker.close()


async def test_no_worker_is_disconnected_no_session():
    worker = FakeWorker()
    await worker.start()
    port = worker.port
    await worker.close()  # nothing listens there now
    link = make_link(port)
    stop = asyncio.Event()
    task = asyncio.create_task(link.run(stop))
    try:
        await asyncio.sleep(0.1)
        assert link.health() == {"worker": "disconnected", "cause": "no_session",
                                 "detail": f"127.0.0.1:{port}"}
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)


async def test_a_refused_hello_is_disconnected_session_refused():
    worker = FakeWorker(versions=(1,))  # a worker that did not enable sampled speculation
    link, stop, task = await running(worker)
    try:
        await until(lambda: link.refused is not None, "the HELLO was not refused")
        h = link.health()
        assert (h["worker"], h["cause"]) == ("disconnected", "session_refused")
        assert h["detail"] == "speculation_not_enabled"
    finally:
        await finish(worker, stop, task)


async def test_a_worker_refusing_every_step_is_degraded_until_a_proposal_verifies():
    worker = FakeWorker(mode="refuse")
    link, stop, task = await running(worker)
    try:
        assert await link.wait_ready(WAIT_S)
        assert link.health()["worker"] == "connected"
        for g in range(1, DEGRADED_AFTER_FAILURES + 1):
            out = await link.propose(step_for(link, generation=g))
            assert isinstance(out, Fallback)
            link.reset(0, g, out.reason)
        h = link.health()
        assert (h["worker"], h["cause"]) == ("degraded", "proposals_failing")
        assert "worker_refused" in h["detail"]
        worker.mode = "answer"
        g = DEGRADED_AFTER_FAILURES + 1
        assert not isinstance(await link.propose(step_for(link, generation=g)), Fallback)
        assert link.health()["worker"] == "connected"
    finally:
        await finish(worker, stop, task)
