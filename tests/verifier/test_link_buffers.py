"""The link's share of the design's sizing (the seed, "Size and critical path"): two
in-flight STEP batches at most, their dense rows' buffers allocated once a v2 session is
negotiated (never for v1, never before HELLO), and a worker whose limits are below what
the verifier needs refused at HELLO ("preflight actual slot/reply limits")."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from fake_worker import FakeWorker
from link_harness import WAIT_S, linked, make_link, running, step_for, until
from wire_helpers import config
from wire_vectors import LIMITS

from pp1q.core.errors import Reason
from pp1q.runtime.metrics import Metrics
from pp1q.verifier.link import Needs, WorkerLink
from pp1q.verifier.steps_in_flight import MAX_BATCHES_IN_FLIGHT, slot_rows

pytestmark = pytest.mark.daemons  # binds a server on 127.0.0.1


async def test_slot_buffers_are_allocated_once_a_v2_session_is_negotiated():
    worker = FakeWorker()
    await worker.start()
    try:
        link = make_link(worker.port)
        assert link.pool.allocations == 0  # built, not yet negotiated: nothing allocated
        async with running(link):
            assert await link.wait_ready(WAIT_S)
            assert link.pool.allocations == slot_rows(LIMITS) == 2 * 4 * 5
            assert link.pool.retained == slot_rows(LIMITS) * LIMITS.dense_row_bytes
            first = link.session
            worker.refuse_connection()  # a new session reuses them
            await until(lambda: link.ready and link.session != first, "a second session")
            assert link.pool.allocations == slot_rows(LIMITS)
    finally:
        await worker.close()


async def test_a_v1_session_allocates_no_dense_buffers():
    worker = FakeWorker(versions=(1,))
    await worker.start()
    try:
        link = WorkerLink("127.0.0.1", worker.port, config(versions=(1,)),
                          Needs(slots=LIMITS.max_slots, depth=3, support=4),
                          Metrics("verifier"), 5.0, 0.2)
        async with running(link):
            assert await link.wait_ready(WAIT_S) and link.version == 1
            assert link.pool.allocations == 0
    finally:
        await worker.close()


async def test_at_most_two_step_batches_are_in_flight():
    # STEPs of one loop tick are one batch; a third tick's STEP waits for a batch to end
    worker = FakeWorker(mode="hang")
    async with linked(worker, step_timeout=0.5) as link:
        assert await link.wait_ready(WAIT_S)
        futures = []
        for slot in range(MAX_BATCHES_IN_FLIGHT + 1):
            futures.append(asyncio.ensure_future(link.propose(step_for(link, slot=slot))))
            await asyncio.sleep(0.05)  # its own tick: its own batch
        await until(lambda: len(worker.steps) == MAX_BATCHES_IN_FLIGHT, "two batches sent")
        await asyncio.sleep(0.1)  # time enough for a third STEP to arrive, were it sent
        assert len(worker.steps) == MAX_BATCHES_IN_FLIGHT and not any(f.done() for f in futures)
        async with asyncio.timeout(WAIT_S):  # the watchdog ends the first batches, then
            await asyncio.gather(*futures)  # the third leaves and times out in its turn
        assert [st.slot for st in worker.steps] == list(range(MAX_BATCHES_IN_FLIGHT + 1))


async def test_a_worker_offering_fewer_slots_than_needed_is_refused_at_hello():
    small = msgspec.structs.replace(LIMITS, max_slots=LIMITS.max_slots - 1)
    metrics = Metrics("verifier")
    async with linked(FakeWorker(limits=small), metrics) as link:
        assert not await link.wait_ready(2.0)
        await until(lambda: link.refused is Reason.UNEXPECTED_SIZE, "the session refused")
        assert metrics.registry.get_sample_value(
            "pp1q_peers_refused_total", {"reason": "hello_incompatible"}) >= 1
        assert link.pool.allocations == 0  # a refused session allocates nothing
