"""Slots shared between client addresses, over HTTP: while one address holds every slot
and has more requests queued, a request from another address takes the next free slot
ahead of that backlog (a FIFO pool fails this); and one address's share of the queue is
refused past its bound (503 busy, counted by reason). Clients bind their own loopback
addresses."""

from __future__ import annotations

import asyncio
import json

import pytest
from fake_decider import FakeDecider
from fake_worker import FakeWorker
from link_harness import PROMPT, WAIT_S, linked, until
from wire_helpers import config

from pp1q.runtime.metrics import Metrics
from pp1q.runtime.settings import VerifierSettings
from pp1q.verifier.daemon import routes
from pp1q.verifier.scheduler import Scheduler
from pp1q.verifier.server import HttpServer

pytestmark = pytest.mark.daemons  # binds servers on 127.0.0.1

A, B = "127.0.0.2", "127.0.0.3"


async def _send(port: int, source: str, speculative: bool):
    """A /v1/generate from ``source``; (reader, writer) of its connection."""
    body = json.dumps({"prompt_token_ids": PROMPT, "max_tokens": 2, "temperature": 0,
                       "speculative": speculative}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(f"POST /v1/generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                 .encode() + body)
    await writer.drain()
    return reader, writer


async def _status(reader) -> int:
    raw = await asyncio.wait_for(reader.read(), WAIT_S)
    return int(raw.split(b" ", 2)[1])


async def test_another_address_takes_the_next_slot_ahead_of_a_backlog():
    worker, metrics = FakeWorker(mode="hang"), Metrics("verifier")
    async with linked(worker, metrics, step_timeout=3600.0) as link:
        decider = FakeDecider()
        scheduler = Scheduler(link, decider, metrics, slots=2, depth=3,
                              queued_per_address=1)
        http = HttpServer(routes(VerifierSettings(), link, scheduler, config(versions=(2,))))
        try:
            port = await http.start("127.0.0.1", 0)
            assert await link.wait_ready(WAIT_S)
            # A's two speculative requests hold both slots (their rounds hang)
            a1 = await _send(port, A, True)
            a2 = await _send(port, A, True)
            await until(lambda: len(worker.steps) == 2, "A's requests never took the slots")
            # A's third waits (target-only: done once served); B's comes after it
            # (speculative: it holds the slot it gets, its round hangs)
            a3 = await _send(port, A, False)
            await until(lambda: metrics.value("pp1q_requests_queued") == 1, "A3 not queued")
            b1 = await _send(port, B, True)
            await until(lambda: metrics.value("pp1q_requests_queued") == 2, "B1 not queued")
            # past A's share of the queue (1): refused at once, counted
            a4 = await _send(port, A, False)
            assert await _status(a4[0]) == 503
            assert metrics.value("pp1q_requests_refused_total",
                                 reason="too_many_queued_from_address") == 1
            a1[1].close()  # A1's client leaves: a slot frees while A still holds one
            opened = lambda: sum(c[0] == "open" for c in decider.calls)  # noqa: E731
            await until(lambda: opened() >= 3, "nothing took the free slot")
            assert metrics.value("pp1q_requests_queued") == 1  # A3 still waits...
            assert not a3[0].at_eof()
            b1[1].close()  # ...until B's slot frees (A still holds one, B none now)
            assert await _status(a3[0]) == 200
            for _, w in (a1, a2, a3, b1, a4):
                w.close()
        finally:
            await http.close()
