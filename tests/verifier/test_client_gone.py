"""Work follows its client: an HTTP client that disconnects, plain or streamed, cancels its
request in the round it is in (here a round whose STEP hangs on the worker), frees its
slot and RESETs the worker's state (reason cancelled); and a STEP still queued in the
link when its request goes never leaves after that RESET. A STEP in flight when its
request goes no longer holds its place among the link's in-flight batches: two clients
leaving mid-round kept both places for ever, and no STEP left the verifier again (every
speculative request hung; found by fuzzing the HTTP API with abandoned streams). That
RESET's resolution of the STEP is nobody's failure: no fallback, nothing fed to the
breaker or /healthz, no invalidation, and the batch's other STEP stays in flight."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import pytest
from fake_decider import FakeDecider
from fake_worker import FakeWorker
from link_harness import PROMPT, WAIT_S, linked, step_for, until
from wire_helpers import config

from pp1q.core.errors import Reason
from pp1q.core.outcomes import FallbackCause
from pp1q.runtime.metrics import Metrics
from pp1q.runtime.settings import VerifierSettings
from pp1q.verifier.api import GenerateRequest
from pp1q.verifier.breaker import State
from pp1q.verifier.daemon import routes
from pp1q.verifier.scheduler import Scheduler
from pp1q.verifier.server import HttpServer
from pp1q.verifier.steps_in_flight import MAX_BATCHES_IN_FLIGHT

pytestmark = pytest.mark.daemons  # binds servers on 127.0.0.1

BODIES = {
    "plain": ("/v1/generate", {"prompt_token_ids": PROMPT, "max_tokens": 64, "temperature": 0}),
    "streamed": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 64, "temperature": 0,
                                     "stream": True}),
}


@pytest.mark.parametrize("kind", list(BODIES))
async def test_a_client_that_leaves_frees_its_slot_and_resets_the_worker(kind):
    worker = FakeWorker(mode="hang")  # the round never ends: only the client's leaving does
    metrics = Metrics("verifier")
    async with linked(worker, metrics, step_timeout=3600.0) as link:
        scheduler = Scheduler(link, FakeDecider(), metrics, slots=1, depth=3)
        http = HttpServer(routes(VerifierSettings(), link, scheduler, config(versions=(2,))))
        try:
            port = await http.start("127.0.0.1", 0)
            assert await link.wait_ready(WAIT_S)
            path, body = BODIES[kind]
            data = json.dumps(body).encode()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
            await writer.drain()
            await until(lambda: worker.steps, "the request's STEP never arrived")
            assert metrics.value("pp1q_slots_in_use") == 1
            writer.close()  # the client goes away mid-round
            await until(lambda: worker.resets, "no RESET after the client left")
            assert [(r.slot, r.reason) for r in worker.resets] == [(0, Reason.CANCELLED)]
            assert worker.resets[0].generation == worker.steps[0].generation
            await until(lambda: metrics.value("pp1q_slots_in_use") == 0, "the slot stayed held")
            assert metrics.value("pp1q_requests_total", outcome="error") == 1
            assert len(worker.steps) == 1  # nothing more was drafted for it
        finally:
            await http.close()


async def test_a_step_queued_when_its_request_goes_never_leaves(caplog):
    worker = FakeWorker()
    async with linked(worker) as link:
        assert await link.wait_ready(WAIT_S)
        step = step_for(link)
        with caplog.at_level(logging.WARNING, logger="pp1q.verifier"):
            fut = link.propose(step)  # queued: the batch leaves at the end of this tick
            fut.cancel()  # the request was cancelled in the same tick...
            assert link.reset(step.slot, step.generation, Reason.CANCELLED)  # ...and released
            await until(lambda: worker.resets, "the RESET never arrived")
            await asyncio.sleep(0.05)
        assert worker.steps == []
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_steps_cancelled_in_flight_free_their_batches():
    # the scheduler's release path for a request cancelled mid-round: its future
    # cancelled, then its slot RESET. The worker's replies to a dead generation are
    # discarded unread, so only the RESET can end the STEP's place in its batch
    worker = FakeWorker(mode="hang")  # no STEP is ever answered: only RESETs end them
    async with linked(worker, step_timeout=3600.0) as link:
        assert await link.wait_ready(WAIT_S)
        for slot in range(MAX_BATCHES_IN_FLIGHT):
            step = step_for(link, slot=slot)
            fut = link.propose(step)
            await until(lambda n=slot + 1: len(worker.steps) == n, "the STEP never left")
            in_flight = link.metrics.steps_in_flight._value.get
            assert in_flight() == 1  # pp1q_steps_in_flight: the STEP holds its place
            fut.cancel()  # its client left mid-round...
            assert link.reset(step.slot, step.generation, Reason.CANCELLED)  # ...released
            assert in_flight() == 0
        await until(lambda: len(worker.resets) == MAX_BATCHES_IN_FLIGHT, "RESETs missing")
        fut = link.propose(step_for(link, slot=MAX_BATCHES_IN_FLIGHT))
        await until(lambda: len(worker.steps) == MAX_BATCHES_IN_FLIGHT + 1,
                    "a new request's STEP never left: the cancelled STEPs held the batches")
        fut.cancel()


async def test_clients_leaving_mid_round_leave_speculation_working():
    # end to end: two HTTP clients leave while their STEPs are out; a third request's
    # STEP must still reach the worker (it waited for ever behind the two dead batches)
    worker = FakeWorker(mode="hang")
    metrics = Metrics("verifier")
    slots = MAX_BATCHES_IN_FLIGHT + 1
    async with linked(worker, metrics, step_timeout=3600.0) as link:
        scheduler = Scheduler(link, FakeDecider(), metrics, slots=slots, depth=3)
        http = HttpServer(routes(VerifierSettings(), link, scheduler, config(versions=(2,))))
        clients = []
        try:
            port = await http.start("127.0.0.1", 0)
            assert await link.wait_ready(WAIT_S)
            path, body = BODIES["streamed"]
            data = json.dumps(body).encode()
            for n in range(1, slots + 1):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                clients.append(writer)
                writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}"
                             f"\r\n\r\n".encode() + data)
                await writer.drain()
                await until(lambda n=n: len(worker.steps) == n,
                            f"request {n}'s STEP never reached the worker")
                if n < slots:
                    writer.close()  # this client goes away mid-round
                    await until(lambda n=n: len(worker.resets) == n, "no RESET")
        finally:
            for writer in clients:
                writer.close()
            await http.close()


async def test_a_request_cancelled_mid_round_is_nobodys_failure():
    # the RESET that frees a cancelled STEP's place resolves its slot's waiter: the
    # scheduler's own future, cancelled with its task before the RESET, so nothing reads
    # that resolution. Not a fallback, nothing fed to the breaker or /healthz, no
    # invalidation; the other slot's STEP of the same batch stays in flight
    worker = FakeWorker(mode="hang")
    metrics = Metrics("verifier")
    async with linked(worker, metrics, step_timeout=3600.0) as link:
        decider = FakeDecider()
        scheduler = Scheduler(link, decider, metrics, slots=2, depth=3)
        assert await link.wait_ready(WAIT_S)
        req = GenerateRequest(prompt=list(PROMPT), max_tokens=8, seed=5, speculative=True,
                              greedy=True, draft_temperature=0.0, top_k=None)
        left, stays = (asyncio.create_task(scheduler.generate(req)) for _ in range(2))
        await until(lambda: len(worker.steps) == 2, "the two STEPs never left")
        left.cancel()
        with pytest.raises(asyncio.CancelledError):
            await left
        await until(lambda: worker.resets, "no RESET for the request that left")
        assert link.circuit.failing == 0 and link.health()["worker"] == "connected"
        assert link.circuit.breaker.state is State.CLOSED
        assert sum(metrics.value("pp1q_fallbacks_total", cause=c.value)
                   for c in FallbackCause) == 0
        assert [c for c in decider.calls if c[0] == "invalidate"] == []
        assert not stays.done() and link.metrics.steps_in_flight._value.get() == 1
        stays.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stays
        assert link.metrics.steps_in_flight._value.get() == 0 and link.circuit.failing == 0


async def test_the_server_closes_while_a_client_leaves_a_large_response_unread():
    """From Python 3.12 a server's wait_closed waits for every connection; a client that
    stops reading a response larger than the sockets' buffers kept it waiting forever
    (a SIGTERM'd verifier then never closed its link). On 3.11 wait_closed never waited."""
    async def large(_request):
        return 200, {"filler": "x" * (32 << 20)}

    http = HttpServer({("GET", "/large"): large})
    port = await http.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1024)
    try:
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        writer.write(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        # the response has started (the server is writing it); then the client reads no more
        assert await asyncio.wait_for(reader.read(1), WAIT_S)
        writer.transport.pause_reading()
        await asyncio.wait_for(http.close(), WAIT_S)
    finally:
        writer.close()
