"""A verifier scripted by a test against a worker daemon over loopback TCP: its HELLO,
CONTEXT and the frames it sends, the events it reads back (tests/worker); and the worker
daemon it talks to, served in the test's own loop."""

from __future__ import annotations

import asyncio
import contextlib

from pp1q.core.prefix import Prefix
from pp1q.models.toy import ToySpec
from pp1q.wire import VerifierEndpoint, context_of
from pp1q.wire.events import SessionStarted
from pp1q.wire.session_config import verifier_config
from pp1q.worker.daemon import serve

TIMEOUT_S = 10.0  # every exchange takes milliseconds
START_S = 120.0  # a sampled worker's warm-up compiles numba on a cold cache (~20 s loaded)
SESSION = 99


class ScriptedVerifier:
    def __init__(self, reader, writer, endpoint: VerifierEndpoint) -> None:
        self.reader, self.writer, self.ep = reader, writer, endpoint
        self.received = b""  # every byte the worker sent, in order

    async def events_until(self, kind) -> list:
        """Read until an event of ``kind`` arrives; all events so far."""
        events = []
        while not any(isinstance(e, kind) for e in events):
            data = await asyncio.wait_for(self.reader.read(65536), TIMEOUT_S)
            assert data, "worker closed the connection"
            self.received += data
            events += self.ep.receive_data(data, 0.0)
        return events

    def send(self, msg) -> None:
        self.writer.write(self.ep.send(msg, 0.0))


async def session(port: int, vocab: int) -> ScriptedVerifier:
    """A started session (id SESSION) of 4 slots, depth 5, support 32, wire v2 or v1."""
    config = verifier_config(ToySpec(vocab=vocab), (2, 1), 4, 5, 32)
    ep = VerifierEndpoint(config, session=SESSION, step_timeout=TIMEOUT_S)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(ep.hello())
    v = ScriptedVerifier(reader, writer, ep)
    assert any(isinstance(e, SessionStarted) for e in await v.events_until(SessionStarted))
    return v


def set_context(v: ScriptedVerifier, slot: int, generation: int, prefix: Prefix) -> None:
    v.send(context_of(session=SESSION, slot=slot, generation=generation,
                      tokens=prefix.tokens, digest=prefix.digest))


@contextlib.asynccontextmanager
async def worker_daemon(settings, **serve_options):
    """The worker daemon (``serve``) in this loop for the block: yields (its port, its
    metrics port); stopped after."""
    stop, ports = asyncio.Event(), []
    task = asyncio.create_task(serve(settings, stop, ready=lambda p, m: ports.append((p, m)),
                                     **serve_options))
    try:
        async with asyncio.timeout(START_S):
            while not ports:
                if task.done():
                    task.result()  # it failed to start: its error, not a timeout
                await asyncio.sleep(0.01)
        yield ports[0]
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT_S)
