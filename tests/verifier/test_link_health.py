"""/healthz's view of the link (WorkerLink.health): "connected" only while rounds can
speculate; otherwise "disconnected" or "degraded" with the cause, against an in-process
worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec
import pytest
from fake_worker import FakeWorker
from link_harness import WAIT_S, linked, make_link, running, step_for, until
from wire_vectors import LIMITS

from pp1q.core.errors import Reason
from pp1q.verifier.link import Fallback
from pp1q.verifier.link_health import DEGRADED_AFTER_FAILURES
from pp1q.wire import Refusal
from pp1q.wire.framing import encode
from pp1q.wire.messages import CONNECTION_SLOT

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


def _no_session_lines(caplog, port: int) -> list[str]:
    head = f"no session with worker 127.0.0.1:{port}: "
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.getMessage().startswith(head)]


async def test_no_worker_says_why_in_the_log(caplog):
    # /healthz said no_session and the journal nothing (the reason was a debug line):
    # an operator whose verifier could not reach the worker had no line to read
    worker = FakeWorker()
    await worker.start()
    port = worker.port
    await worker.close()
    with caplog.at_level(logging.WARNING, logger="pp1q.verifier"):
        async with running(make_link(port)):
            await until(lambda: _no_session_lines(caplog, port), "no line said why")
    line = _no_session_lines(caplog, port)[0]
    assert "Connection refused" in line and "retrying" in line, line


async def test_a_worker_name_that_does_not_resolve_says_why(caplog):
    # a resolver's failure (socket.gaierror) has a negative errno, which os.strerror
    # names "Unknown error -2": its own strerror says why ("Name or service not known")
    link = make_link(1)
    link.host = "no-such-host.invalid"  # .invalid never resolves (RFC 2606)
    head = "no session with worker no-such-host.invalid:1: "
    with caplog.at_level(logging.WARNING, logger="pp1q.verifier"):
        async with running(link):
            await until(lambda: any(r.getMessage().startswith(head)
                                    for r in caplog.records), "no line said why")
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith(head))
    assert "Unknown error" not in line and "retrying" in line, line


async def test_a_connection_closed_before_the_hello_answer_says_so(caplog):
    # what a plain verifier sees of a worker that requires TLS: accepted, then closed
    async def close_at_once(_reader, writer):
        writer.close()

    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with caplog.at_level(logging.WARNING, logger="pp1q.verifier"):
            async with running(make_link(port)) as link:
                await until(lambda: _no_session_lines(caplog, port), "no line said why")
                assert link.health()["cause"] == "no_session"
    finally:
        server.close()
        await server.wait_closed()
    assert "closed before HELLO was answered" in _no_session_lines(caplog, port)[0]


async def test_a_refused_hello_is_disconnected_session_refused():
    worker = FakeWorker(versions=(1,))  # a worker that did not enable sampled speculation
    async with linked(worker) as link:
        await until(lambda: link.refused is not None, "the HELLO was not refused")
        h = link.health()
        assert (h["worker"], h["cause"]) == ("disconnected", "session_refused")
        assert h["detail"] == "speculation_not_enabled"


async def test_a_worker_refusing_every_hello_logs_a_line_a_reason(caplog):
    # each reconnection is refused alike: counted each time, logged once an interval
    # (was: an ERROR line per reconnection, for as long as the pair was mismatched)
    worker = FakeWorker(versions=(1,))
    with caplog.at_level(logging.INFO, logger="pp1q.verifier"):
        async with linked(worker) as link:
            await until(lambda: link.metrics.value(
                "pp1q_validation_failures_total", reason="speculation_not_enabled") >= 3,
                "fewer than 3 HELLOs refused")
    lines = [r for r in caplog.records if "worker refused the session" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


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


async def _answering(answer: bytes):
    """A server that answers a HELLO with ``answer`` and then reads until closed."""
    async def handle(reader, writer):
        await reader.read(65536)
        writer.write(answer)
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def test_a_refusal_detail_cannot_forge_a_log_line(caplog):
    # the REFUSAL's detail is the peer's text (256 characters, any): written as it came,
    # a newline in it began a line of the peer's choosing in the verifier's journal
    forged = "mismatched vocab\n2026-12-08 00:00:00 verifier ERROR pp1q.verifier: forged"
    server = await _answering(encode(Refusal(
        session=0, slot=CONNECTION_SLOT, generation=0, round_id=0,
        reason=Reason.WRONG_IDENTITY, detail=forged)))
    port = server.sockets[0].getsockname()[1]
    try:
        with caplog.at_level(logging.INFO, logger="pp1q.verifier"):
            async with running(make_link(port)) as link:
                await until(lambda: link.refused is not None, "the HELLO was not refused")
    finally:
        server.close()
        await server.wait_closed()
    lines = [r.getMessage() for r in caplog.records if "refused the session" in r.getMessage()]
    assert lines and "forged" in lines[0], lines
    assert not any("\n" in r.getMessage() for r in caplog.records), lines
    assert "vocab: here 16" in lines[0], lines  # the named field's own value is still added


async def test_an_answer_the_verifier_rejects_is_not_called_a_close(caplog):
    # a worker (or anything else on its port) that answers the HELLO with bytes that are
    # no HELLO answer: the verifier drops it, and says so once an interval, not as
    # "closed before HELLO was answered" (what a TLS worker's silent close is)
    server = await _answering(b"XXXX" + bytes(28))
    port = server.sockets[0].getsockname()[1]
    try:
        with caplog.at_level(logging.INFO, logger="pp1q.verifier"):
            async with running(make_link(port)) as link:
                await until(lambda: link.metrics.value(
                    "pp1q_validation_failures_total", reason="bad_magic") >= 3,
                    "fewer than 3 answers rejected")
    finally:
        server.close()
        await server.wait_closed()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not any("closed before HELLO was answered" in m for m in said), said
    assert len([m for m in said if "bad_magic" in m]) == 1, said


async def test_a_worker_with_too_few_slots_logs_a_line_an_interval(caplog):
    # the verifier refuses each reconnection's session alike: a line per interval, as a
    # refused HELLO (was: an ERROR per reconnection for as long as the pair was deployed)
    small = msgspec.structs.replace(LIMITS, max_slots=LIMITS.max_slots - 1)
    with caplog.at_level(logging.INFO, logger="pp1q.verifier"):
        async with linked(FakeWorker(limits=small)) as link:
            await until(lambda: link.metrics.value(
                "pp1q_peers_refused_total", reason="hello_incompatible") >= 3,
                "fewer than 3 sessions refused")
    lines = [r for r in caplog.records if "limits too small" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
