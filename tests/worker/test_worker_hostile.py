"""Hostile peers against the worker daemon in-process, over real loopback TCP (issue 16):
idle HELLO sessions cannot lock out a verifier, a live session id cannot be taken over,
HELLO and idle deadlines and the connection cap close what they must with a REFUSAL and
a count, a frame the state never receives is refused at its header, and 1,000 closed
connections leave no WorkerConnection behind (without the cycle collector)."""

from __future__ import annotations

import asyncio
import gc
import os

import numpy as np
import pytest

from pp1q.core.errors import DistributionError, Reason
from pp1q.core.prefix import Prefix
from pp1q.models.toy import ToySpec
from pp1q.runtime.settings import WorkerSettings
from pp1q.tools.chaos.rig import scrape, value
from pp1q.wire import (
    FrameDecoder,
    Refusal,
    Step,
    VerifierEndpoint,
    WorkerEndpoint,
    context_of,
)
from pp1q.wire.events import ProposalFailed, SessionStarted
from pp1q.wire.framing import encode
from pp1q.wire.messages import Form, Reply
from pp1q.wire.session_config import verifier_config
from pp1q.worker.connection import WorkerConnection
from pp1q.worker.daemon import serve
from pp1q.worker.drafting import Proposer

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

VOCAB = 16
TIMEOUT_S = 10.0  # every exchange below takes milliseconds
CONFIG = verifier_config(ToySpec(vocab=VOCAB), (2,), 4, 5, 8)


class Worker:
    def __init__(self, port: int, mport: int) -> None:
        self.port, self.mport = port, mport

    def count(self, name: str, **labels) -> float:
        return value(scrape(self.mport), name, **labels)

    async def connect(self):
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def send_until_closed(self, data: bytes) -> None:
        """A connection that sends ``data`` and reads until the worker closes it."""
        reader, writer = await self.connect()
        writer.write(data)
        while await asyncio.wait_for(reader.read(65536), TIMEOUT_S):
            pass
        writer.close()

    async def hello(self, session: int):
        """A connection that said HELLO; (reader, writer, events of the answer)."""
        v = VerifierEndpoint(CONFIG, session=session)
        reader, writer = await self.connect()
        writer.write(v.hello())
        data = await asyncio.wait_for(reader.read(65536), TIMEOUT_S)
        return reader, writer, (v.receive_data(data, 0.0) if data else [])


async def _refusal_then_close(reader) -> Refusal:
    """Read until EOF; the last frame must be a REFUSAL (what the worker closed with)."""
    data = b""
    while chunk := await asyncio.wait_for(reader.read(65536), TIMEOUT_S):
        data += chunk
    msg = FrameDecoder().feed(data)[-1]
    assert isinstance(msg, Refusal)
    return msg


@pytest.fixture
async def worker(request):
    over = getattr(request, "param", {})
    stop, ports = asyncio.Event(), []
    settings = WorkerSettings(listen="127.0.0.1:0", vocab=VOCAB, metrics_port=0,
                              speculation="sampled", **over)
    task = asyncio.create_task(serve(settings, stop, ready=lambda p, m: ports.append((p, m))))
    while not ports:
        await asyncio.sleep(0.01)
    yield Worker(*ports[0])
    stop.set()
    await asyncio.wait_for(task, TIMEOUT_S)


async def test_64_idle_hello_sessions_do_not_lock_out_the_verifier(worker):
    """The issue's 64 idle sessions: the verifier's HELLO is answered; each stranger
    evicted for it (or for another stranger) got a REFUSAL and was counted."""
    strangers = [await worker.hello(1000 + i) for i in range(64)]
    assert all(any(isinstance(e, SessionStarted) for e in ev) for _, _, ev in strangers)
    _, writer, events = await worker.hello(7)
    assert any(isinstance(e, SessionStarted) for e in events)
    refused = await _refusal_then_close(strangers[0][0])
    assert refused.reason == Reason.EVICTED
    assert worker.count("pp1q_connections_closed_total", reason="evicted") == 64 - 8 + 1
    for _, w, _ in strangers:
        w.close()
    writer.close()


async def test_a_live_session_id_is_not_taken_over(worker):
    _, honest, ev = await worker.hello(4242)
    assert any(isinstance(e, SessionStarted) for e in ev)
    reader, writer = await worker.connect()
    writer.write(VerifierEndpoint(CONFIG, session=4242).hello())
    refused = await _refusal_then_close(reader)
    assert refused.reason == Reason.SESSION_IN_USE
    writer.close()
    assert worker.count("pp1q_peers_refused_total", reason="session_in_use") == 1
    # the first session is untouched: a third HELLO with its id is still refused
    r3, w3 = await worker.connect()
    w3.write(VerifierEndpoint(CONFIG, session=4242).hello())
    assert (await _refusal_then_close(r3)).reason == Reason.SESSION_IN_USE
    w3.close()
    assert not honest.is_closing()
    honest.close()


@pytest.mark.parametrize("worker", [{"hello_timeout_s": 0.2, "idle_timeout_s": 0.2}],
                         indirect=True)
async def test_deadlines_close_silent_connections_with_a_refusal_and_a_count(worker):
    reader, writer = await worker.connect()  # says nothing
    assert (await _refusal_then_close(reader)).reason == Reason.HELLO_TIMEOUT
    writer.close()
    reader, writer, ev = await worker.hello(5)  # HELLO, then nothing
    assert any(isinstance(e, SessionStarted) for e in ev)
    assert (await _refusal_then_close(reader)).reason == Reason.IDLE_TIMEOUT
    writer.close()
    assert worker.count("pp1q_connections_closed_total", reason="hello_timeout") == 1
    assert worker.count("pp1q_connections_closed_total", reason="idle_timeout") == 1


@pytest.mark.parametrize("worker", [{"max_connections": 3, "max_sessions": 2,
                                     "max_pending_sessions": 1}], indirect=True)
async def test_the_connection_cap_closes_the_oldest_silent_connection(worker):
    conns = [await worker.connect() for _ in range(3)]
    await asyncio.sleep(0.05)  # accepted by the worker (no assert depends on it)
    _, _, ev = await worker.hello(9)  # the fourth connection: admitted, answered
    assert any(isinstance(e, SessionStarted) for e in ev)
    refused = await _refusal_then_close(conns[0][0])
    assert refused.reason == Reason.TOO_MANY_CONNECTIONS
    assert worker.count("pp1q_connections_closed_total", reason="too_many_connections") == 1
    for _, w in conns:
        w.close()


async def test_a_connection_closed_before_hello_is_counted(worker):
    _, writer = await worker.connect()
    writer.close()
    for _ in range(200):  # bounded: the worker sees the close within milliseconds
        if worker.count("pp1q_connections_closed_total", reason="no_hello") == 1:
            break
        await asyncio.sleep(0.02)
    assert worker.count("pp1q_connections_closed_total", reason="no_hello") == 1


def _half_dense_reply() -> bytes:
    """A well-formed dense REPLY (VOCAB entries) but its last payload byte: the issue's
    probe, which once made the worker allocate and hold the row before any HELLO."""
    frame = encode(Reply(session=1, slot=0, generation=0, round_id=0, index=1, position=0,
                         token=0, form=Form.DENSE, entries=VOCAB,
                         q=np.zeros(VOCAB, "<f4")))
    return frame[:-1]


async def test_a_reply_before_hello_is_refused_at_its_header(worker):
    reader, writer = await worker.connect()
    writer.write(_half_dense_reply())
    assert await asyncio.wait_for(reader.read(65536), TIMEOUT_S) == b""  # closed on us
    writer.close()
    assert worker.count("pp1q_validation_failures_total", reason="state_not_allowed") == 1


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _live(cls) -> int:
    return sum(1 for o in gc.get_objects() if type(o) is cls)


CONNECTIONS = 1000
BATCH = 50  # connections open at once
RSS_GROWTH_MAX = 32 << 20  # 1,500 half-sent dense rows held 750 MB before; bounded now


async def test_1000_closed_connections_leave_nothing_behind(worker):
    """Without gc.collect() (the collector off): each closed WorkerConnection and its
    endpoint are freed by reference counting alone, and RSS stays near where it was."""

    async def one(i: int) -> None:
        reader, writer = await worker.connect()
        if i % 3 == 0:  # the probe: a dense REPLY half sent before HELLO
            writer.write(_half_dense_reply())
        elif i % 3 == 1:  # a session, then gone
            writer.write(VerifierEndpoint(CONFIG, session=10_000 + i).hello())
            await asyncio.wait_for(reader.read(65536), TIMEOUT_S)
        writer.close()
        await writer.wait_closed()

    for i in range(BATCH):  # warm-up: allocator pools, lazily built tables
        await one(i)
    await asyncio.sleep(0.1)
    gc.collect()
    gc.disable()
    try:
        base_conns, base_eps, base_rss = _live(WorkerConnection), _live(WorkerEndpoint), \
            _rss_bytes()
        for start in range(0, CONNECTIONS, BATCH):
            await asyncio.gather(*(one(start + i) for i in range(BATCH)))
        for _ in range(100):  # bounded: the worker sees the last closes within milliseconds
            if _live(WorkerConnection) <= base_conns:
                break
            await asyncio.sleep(0.02)
        conns, eps, rss = _live(WorkerConnection), _live(WorkerEndpoint), _rss_bytes()
    finally:
        gc.enable()
    assert conns <= base_conns and eps <= base_eps, (conns, eps, base_conns, base_eps)
    assert rss - base_rss < RSS_GROWTH_MAX, rss - base_rss


# -- counting gaps (issue 16, item 9) ------------------------------------------------


async def test_a_bad_frame_right_after_hello_counts_under_its_own_reason(worker):
    reader, writer = await worker.connect()
    writer.write(VerifierEndpoint(CONFIG, session=12).hello() + b"XXXX" + bytes(28))
    while await asyncio.wait_for(reader.read(65536), TIMEOUT_S):
        pass
    writer.close()
    assert worker.count("pp1q_validation_failures_total", reason="bad_magic") == 1
    assert worker.count("pp1q_peers_refused_total", reason="hello_incompatible") == 0


async def test_a_flood_of_bad_connections_logs_a_line_a_reason_not_one_each(worker, caplog):
    """50 connections that each send a bad frame: every one counted, one log line for the
    reason in the interval (was: a line each: 9,278 lines in 20 s from one flooding peer)."""
    import logging

    n = 50
    with caplog.at_level(logging.INFO, logger="pp1q"):
        for _ in range(n):
            await worker.send_until_closed(b"XXXX" + bytes(28))
    assert worker.count("pp1q_validation_failures_total", reason="bad_magic") == n
    lines = [r for r in caplog.records if "bad_magic" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


async def test_hellos_refused_again_and_again_log_a_line_a_reason(worker, caplog):
    """A verifier of another model reconnects for ever and is refused each time: each
    refusal counted, one log line for the reason in the interval (was: a WARNING per
    HELLO, against operations.md's "one line per reason per 10 s" for what a peer causes
    once per connection)."""
    import logging

    other = verifier_config(ToySpec(vocab=VOCAB, seed=1), (2,), 4, 5, 8)  # another model
    n = 20
    with caplog.at_level(logging.INFO, logger="pp1q"):
        for i in range(n):
            await worker.send_until_closed(VerifierEndpoint(other, session=1000 + i).hello())
    assert worker.count("pp1q_peers_refused_total", reason="identity_mismatch") == n
    lines = [r for r in caplog.records if "HELLO refused (wrong_identity)" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


async def test_a_peers_refusal_detail_cannot_forge_a_log_line(worker, caplog):
    """Any peer that passes HELLO may send a REFUSAL; its detail (256 characters, any)
    was written as it came, so a newline in it began a line of the peer's choosing in
    the worker's journal."""
    import logging

    forged = "bye\n2026-12-08 00:00:00 worker CRITICAL pp1q.worker: forged"
    with caplog.at_level(logging.INFO, logger="pp1q"):
        reader, writer, events = await worker.hello(77)
        assert any(isinstance(e, SessionStarted) for e in events)
        writer.write(encode(Refusal(session=77, slot=-1, generation=0, round_id=0,
                                    reason=Reason.WRONG_IDENTITY, detail=forged)))
        while await asyncio.wait_for(reader.read(65536), TIMEOUT_S):
            pass
        writer.close()
    said = [r.getMessage() for r in caplog.records]
    assert any("forged" in m for m in said), said
    assert not any("\n" in m for m in said), said


class _Aborting(Proposer):
    """A drafter that fails mid-proposal (through the serve() proposer seam)."""

    def rows(self, step, prefix):
        yield from ()
        raise DistributionError(Reason.ZERO_MASS, "planted: the drafter's row has no mass")


async def test_a_drafting_abort_is_counted_with_its_reason():
    stop, ports = asyncio.Event(), []
    settings = WorkerSettings(listen="127.0.0.1:0", vocab=VOCAB, metrics_port=0,
                              speculation="sampled")
    task = asyncio.create_task(serve(settings, stop, ready=lambda p, m: ports.append((p, m)),
                                     proposer=_Aborting))
    while not ports:
        await asyncio.sleep(0.01)
    w = Worker(*ports[0])
    try:
        v = VerifierEndpoint(CONFIG, session=21, step_timeout=TIMEOUT_S)
        reader, writer = await w.connect()
        writer.write(v.hello())
        v.receive_data(await asyncio.wait_for(reader.read(65536), TIMEOUT_S), 0.0)
        prefix = Prefix([1, 2, 3])
        writer.write(v.send(context_of(session=21, slot=0, generation=0,
                                       tokens=prefix.tokens, digest=prefix.digest)))
        writer.write(v.send(Step(session=21, slot=0, generation=1, round_id=1,
                                 last_committed=prefix.last_position,
                                 first_position=prefix.last_position + 1, depth=3, seed=5,
                                 temperature=1.0, top_k=4, context_version=0,
                                 prefix_digest=prefix.digest), 0.0))
        events = []
        while not any(isinstance(e, ProposalFailed) for e in events):
            data = await asyncio.wait_for(reader.read(65536), TIMEOUT_S)
            assert data
            events += v.receive_data(data, 0.0)
        writer.close()
        assert w.count("pp1q_drafting_aborts_total", reason="zero_mass") == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT_S)
