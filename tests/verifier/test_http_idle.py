"""Idle connections a full HTTP server takes (pp1q.verifier.http_gate, ``Gates.reclaim``):
with every place held, a newcomer from an address holding at least two fewer takes a
connection of the address holding the most that waits for its next request (nothing
lost: nginx drains idle keep-alive connections so when full), before one whose answer
waits unread; a connection whose request is being answered is never taken. The gate fed
by hand, then aiohttp's own idle test pinned and the whole path through sockets."""

from __future__ import annotations

import asyncio

import pytest
from http_gate_harness import FedTransport, RecordingHandler, Served, connect, status
from link_harness import WAIT_S, until

from pp1q.core.errors import Reason
from pp1q.verifier.http_gate import Gates
from pp1q.verifier.server import Limits, waiting_for_request

pytestmark = pytest.mark.daemons  # binds servers on 127.0.0.1


class _Handler(RecordingHandler):
    """aiohttp's handler's place, saying whether it waits for its next request."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = False


def _everything_waits(_handler) -> bool:
    """Planted: an idle test that does not look at the handler (any connection idle)."""
    return True


async def _taken_in_turn(waiting_for_request) -> list[tuple[str, Reason]]:
    """Every place held by A (4: busy, idle, paused and slow, busy) and B (2: idle,
    busy); newcomers arrive one by one. Which place each takes, and why."""
    aborted: list[Reason] = []
    limits = Limits(max_connections=6, max_connections_per_address=0, write_stall_s=60,
                    reclaim_stall_s=0.2)
    gates = Gates(limits, _Handler, on_aborted=aborted.append,
                  waiting_for_request=waiting_for_request)
    names: dict = {}  # transport: its name
    made: list = []

    def connection(peer: str, name: str = ""):
        gate, transport = gates(), FedTransport(peer)
        gate.connection_made(transport)
        names[transport] = name
        made.append(gate)
        return gate

    a = [connection("10.0.0.1", f"a{i}") for i in range(4)]
    b = [connection("10.0.0.2", f"b{i}") for i in range(2)]
    a[1]._inner.waiting = b[0]._inner.waiting = True
    a[2]._inner.waiting = True  # its last answer waits unsent: slow, not idle
    a[2].pause_writing()
    await asyncio.sleep(0.25)  # past reclaim_stall_s
    taken: list[tuple[str, Reason]] = []

    def arrive(peer: str) -> None:
        before = {t for t in names if t.aborted}
        connection(peer)
        now = {t for t in names if t.aborted} - before
        taken.append((",".join(sorted(names[t] for t in now)) or "refused",
                      aborted[-1] if now else None))

    arrive("10.0.0.3")  # A holds 4: its idle place, not its slow one
    arrive("10.0.0.3")  # C holds 1, A 3: A's slow place (A has no idle one left)
    arrive("10.0.0.4")  # A and B hold 2: B's idle place
    arrive("10.0.0.5")  # A's two busy, nobody else above 1: refused
    a[0]._inner.waiting = True  # a0's answer went out: idle now
    await asyncio.sleep(0.15)  # past RECLAIM_SCAN_GAP_S
    arrive("10.0.0.5")
    for gate in made:  # what each abort leads to: nothing released twice
        gate.connection_lost(None)
    assert gates.counts.open == 0 and gates.held == {}
    return taken


async def test_idle_places_go_first_and_busy_ones_never():
    assert await _taken_in_turn(waiting_for_request=lambda h: h.waiting) == [
        ("a1", Reason.IDLE_OVER_SHARE), ("a2", Reason.OVER_SHARE),
        ("b0", Reason.IDLE_OVER_SHARE), ("refused", None), ("a0", Reason.IDLE_OVER_SHARE)]


async def test_the_planted_idle_test_takes_a_busy_place():
    """The same newcomers with an idle test that ignores the handler: the first takes
    a0, whose request is being answered (what the test above rejects)."""
    taken = await _taken_in_turn(waiting_for_request=_everything_waits)
    assert taken[0] == ("a0", Reason.IDLE_OVER_SHARE)


def _gates_of(s: Served, source: str) -> list:
    return list(s.server.gates.held.get(source, {}))


async def test_aiohttp_waits_for_a_request_only_between_requests():
    """Pins ``waiting_for_request`` to the aiohttp installed: a connection is idle before
    its first request and after each answer, never while a handler runs."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(_request):
        entered.set()
        await release.wait()
        return 200, {}

    async with Served(Limits(head_timeout_s=30), {("GET", "/slow"): slow}) as s:
        reader, writer = await connect(s.port, "127.0.0.2")
        try:
            await until(lambda: len(_gates_of(s, "127.0.0.2")) == 1, "never admitted")
            (gate,) = _gates_of(s, "127.0.0.2")
            await until(lambda: gate.idle, "a new connection never waited for its request")
            writer.write(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
            await asyncio.wait_for(entered.wait(), WAIT_S)
            assert not gate.idle and not waiting_for_request(gate._inner)
            release.set()
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
            await until(lambda: gate.idle, "an answered connection never waited again")
        finally:
            writer.close()


async def _answered(port: int, source: str, path: bytes = b"/small"):
    """A keep-alive connection from ``source`` that has had one answer."""
    reader, writer = await connect(port, source)
    writer.write(b"GET %s HTTP/1.1\r\nHost: a\r\n\r\n" % path)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    await asyncio.wait_for(reader.readexactly(length), WAIT_S)
    return reader, writer


@pytest.mark.parametrize("idle_test, honest", [
    (waiting_for_request, (200, "")),
    (lambda _handler: False, (503, "busy")),  # the lock-out taking idle places ends
])
async def test_idle_keep_alive_connections_at_two_addresses_do_not_lock_a_third_out(
        idle_test, honest, monkeypatch):
    """Two addresses hold every place with answered keep-alive connections (a client
    cycling cheap requests within the head timeout holds them so for good): a third
    address is served, and the connection taken reads a clean end, no answer cut."""
    monkeypatch.setattr("pp1q.verifier.server.waiting_for_request", idle_test)
    limits = Limits(max_connections=4, max_connections_per_address=2, head_timeout_s=30)
    async with Served(limits) as s:
        held = [await _answered(s.port, source)
                for source in ("127.0.0.2", "127.0.0.3") for _ in range(2)]
        try:
            assert await status(s.port) == honest
            if idle_test is waiting_for_request:
                assert s.aborted == [Reason.IDLE_OVER_SHARE] and s.refused == []
                await until(lambda: sum(r.at_eof() for r, _ in held) == 1,
                            "the taken connection never ended")
                (taken,) = [r for r, _ in held if r.at_eof()]
                assert await taken.read() == b""  # closed between answers: nothing cut
            else:
                assert s.aborted == [] and s.refused == [Reason.TOO_MANY_CONNECTIONS]
        finally:
            for _, w in held:
                w.close()


async def test_a_connection_being_answered_is_never_taken():
    """Address B's two connections wait for their answers, C's two are idle: a newcomer
    takes one of C's, the next is refused (B holds two, all busy), and B's answers
    arrive whole once their handlers finish."""
    release = asyncio.Event()

    async def slow(_request):
        await release.wait()
        return 200, {"done": True}

    async def small(_request):
        return 200, {}

    routes_ = {("GET", "/slow"): slow, ("GET", "/small"): small}
    limits = Limits(max_connections=4, max_connections_per_address=2, head_timeout_s=30)
    async with Served(limits, routes_) as s:
        busy = []
        for _ in range(2):
            reader, writer = await connect(s.port, "127.0.0.2")
            writer.write(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
            busy.append((reader, writer))
        idle = [await _answered(s.port, "127.0.0.3") for _ in range(2)]
        try:
            await until(lambda: not any(g.idle for g in _gates_of(s, "127.0.0.2")),
                        "the slow requests never reached their handlers")
            assert await status(s.port, "127.0.0.1") == (200, "")
            assert s.aborted == [Reason.IDLE_OVER_SHARE]
            assert len(_gates_of(s, "127.0.0.3")) == 1 and len(_gates_of(s, "127.0.0.2")) == 2
            assert await status(s.port, "127.0.0.4") == (503, "busy")
            release.set()
            for reader, _ in busy:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
                assert head.startswith(b"HTTP/1.1 200")
        finally:
            for _, w in busy + idle:
                w.close()
