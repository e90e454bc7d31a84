"""/healthz's view of the link (WorkerLink.health): "connected" only while rounds can
speculate; otherwise "disconnected" or "degraded" with the cause, against an in-process
worker."""

from __future__ import annotations

import asyncio

import pytest
from fake_worker import FakeWorker
from link_harness import WAIT_S, linked, make_link, running, step_for, until

from pp1q.verifier.link import DEGRADED_AFTER_FAILURES, Fallback

pytestmark = pytest.mark.daemons  # binds a server on 127.0.0.1


async def test_no_worker_is_disconnected_no_session():
    worker = FakeWorker()
    await worker.start()
    port = worker.port
    await worker.close()  # nothing listens there now
    async with running(make_link(port)) as link:
        await asyncio.sleep(0.1)
        assert link.health() == {"worker": "disconnected", "cause": "no_session",
                                 "detail": f"127.0.0.1:{port}"}


async def test_a_refused_hello_is_disconnected_session_refused():
    worker = FakeWorker(versions=(1,))  # a worker that did not enable sampled speculation
    async with linked(worker) as link:
        await until(lambda: link.refused is not None, "the HELLO was not refused")
        h = link.health()
        assert (h["worker"], h["cause"]) == ("disconnected", "session_refused")
        assert h["detail"] == "speculation_not_enabled"


async def test_a_worker_refusing_every_step_is_degraded_until_a_proposal_verifies():
    worker = FakeWorker(mode="refuse")
    async with linked(worker) as link:
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
