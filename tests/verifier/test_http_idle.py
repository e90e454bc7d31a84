"""Idle connections a full HTTP server takes (pp1q.verifier.http_gate, ``Gates.reclaim``):
with every place held, a newcomer from an address holding at least two fewer takes a
connection of the address holding the most that waits for its next request (nothing
lost: nginx drains idle keep-alive connections so when full), before one whose answer
waits unread; a connection whose request is being answered is never taken. The gate fed
by hand, then aiohttp's own idle test pinned and the whole path through sockets."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web
from http_gate_harness import GET, FedTransport, RecordingHandler, Served, connect, status
from link_harness import WAIT_S, until

from pp1q.core.errors import Reason
from pp1q.verifier.http_gate import Gates, kernel_queues_empty
from pp1q.verifier.server import Limits, read_body, waiting_for_request

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


async def _small(_request):
    return 200, {}


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
            await until(lambda: len(_gates_of(s, "127.0.0.2")) == 2
                        and not any(g.idle for g in _gates_of(s, "127.0.0.2")),
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


async def test_a_slow_place_of_the_address_holding_the_most_goes_before_an_idle_one_of_fewer():
    """Idle before slow only at the same count or above: A holds 4, one slow; B holds 3,
    one idle; a new address takes A's slow place (review of ee11a45)."""
    aborted: list[Reason] = []
    limits = Limits(max_connections=7, max_connections_per_address=0, write_stall_s=60,
                    reclaim_stall_s=0.05)
    gates = Gates(limits, _Handler, on_aborted=aborted.append,
                  waiting_for_request=lambda h: h.waiting)
    made = {}
    for peer, n in (("10.0.0.1", 4), ("10.0.0.2", 3)):
        for i in range(n):
            gate, transport = gates(), FedTransport(peer)
            gate.connection_made(transport)
            made[peer, i] = gate, transport
    made["10.0.0.1", 1][0].pause_writing()
    made["10.0.0.2", 0][0]._inner.waiting = True
    await asyncio.sleep(0.1)
    gates().connection_made(FedTransport("10.0.0.3"))
    assert aborted == [Reason.OVER_SHARE]
    assert [key for key, (_, t) in made.items() if t.aborted] == [("10.0.0.1", 1)]


async def test_a_request_handed_to_aiohttp_is_not_idle_before_its_handler_starts():
    """Once aiohttp holds a whole request head its waiter is done, though the handler has
    not started: the connection is not idle in that window (pins the ``done()`` half)."""
    async with Served(Limits(head_timeout_s=30)) as s:
        reader, writer = await connect(s.port, "127.0.0.2")
        try:
            await until(lambda: len(_gates_of(s, "127.0.0.2")) == 1, "never admitted")
            (gate,) = _gates_of(s, "127.0.0.2")
            await until(lambda: gate.idle, "a new connection never waited for its request")
            gate.data_received(b"GET /small HTTP/1.1\r\nHost: a\r\n\r\n")  # no yield after
            assert not gate.idle
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        finally:
            writer.close()


async def test_a_request_waiting_in_the_kernel_keeps_its_connection(monkeypatch):
    """A keep-alive client's next request has arrived but the loop has not read it (busy,
    as when every place is held): that connection is not idle (an abort would reset the
    client's request); the address's other idle one is taken (review of ee11a45)."""
    limits = Limits(max_connections=2, max_connections_per_address=2, head_timeout_s=30)
    async with Served(limits) as s:
        held = [await _answered(s.port, "127.0.0.2") for _ in range(2)]
        gates = s.server.gates
        admit = gates.admit
        first_reader, first_writer = held[0]  # the oldest: the one taken when both idle

        def busy_admit(gate, address):
            if address == "127.0.0.1":
                first_writer.write(GET)  # reaches the server's kernel, unread
                time.sleep(0.05)  # the loop busy elsewhere meanwhile
            return admit(gate, address)

        monkeypatch.setattr(gates, "admit", busy_admit)
        try:
            assert await status(s.port) == (200, "")
            assert s.aborted == [Reason.IDLE_OVER_SHARE]
            head = await asyncio.wait_for(first_reader.readuntil(b"\r\n\r\n"), WAIT_S)
            assert head.startswith(b"HTTP/1.1 200")  # its request was answered
        finally:
            for _, w in held:
                w.close()


@pytest.mark.parametrize("queues_empty, whole", [
    (kernel_queues_empty, True),
    (lambda _transport: True, False),  # planted: the kernel's send queue not looked at
])
async def test_an_answer_still_in_the_kernel_keeps_its_connection(queues_empty, whole,
                                                                  monkeypatch):
    """A 600 KB answer left the transport (aiohttp waits for the next request) but sits in
    the server's kernel send queue, the client reading slowly. Taken then, the client's
    next request meets a closed socket, whose RST drops the queued rest of the answer:
    the connection is idle only once the client has acknowledged every byte."""
    monkeypatch.setattr("pp1q.verifier.http_gate.kernel_queues_empty", queues_empty)
    big = b"x" * 600_000

    async def large(_request):
        return web.Response(body=big)

    limits = Limits(max_connections=2, max_connections_per_address=2, head_timeout_s=30)
    async with Served(limits, {("GET", "/small"): large}) as s:
        reader, writer = await connect(s.port, "127.0.0.2", rcvbuf=4096)
        other = await connect(s.port, "127.0.0.2")
        (gate, _) = _gates_of(s, "127.0.0.2")
        writer.write(GET)
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        got = 0
        try:
            while not gate.idle:  # read slowly until the gate calls it idle
                got += len(await asyncio.wait_for(reader.read(4096), WAIT_S))
                await asyncio.sleep(0.001)
            newcomer = await connect(s.port, "127.0.0.1")
            await until(lambda: s.aborted, "nothing taken")
            assert s.aborted == [Reason.IDLE_OVER_SHARE]
            writer.write(GET)  # the client's next request, to a closed socket
            try:
                while chunk := await asyncio.wait_for(reader.read(65536), WAIT_S):
                    got += len(chunk)
            except ConnectionError:
                pass  # reset: what was still queued for it is lost
            newcomer[1].close()
            assert (got == len(big)) == whole, got
        finally:
            writer.close()
            other[1].close()


@pytest.mark.parametrize("watched, honest", [
    (True, (200, "")),
    (False, (503, "busy")),  # planted: bodies not watched, the lock-out
])
async def test_trickling_bodies_at_two_addresses_do_not_lock_a_third_out(
        watched, honest, monkeypatch):
    """Two addresses hold every place with request heads whose declared bodies never come
    (each within the 30 s body timeout: a cheap request every 30 s holds a place for
    good, taking no slot): past reclaim_stall_s a third address takes one of them."""
    if not watched:
        monkeypatch.setattr("pp1q.verifier.http_gate.Gate.awaiting_body", lambda *_: None)

    async def echo(request):
        return 200, {"n": len(await read_body(request))}

    limits = Limits(max_connections=4, max_connections_per_address=2, head_timeout_s=30,
                    body_timeout_s=30, reclaim_stall_s=0.3)
    async with Served(limits, {("POST", "/echo"): echo, ("GET", "/small"): _small}) as s:
        held = []
        for source in ("127.0.0.2", "127.0.0.3"):
            for _ in range(2):
                reader, writer = await connect(s.port, source)
                writer.write(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n")
                held.append((reader, writer))
        try:
            gates = s.server.gates
            await until(lambda: gates.counts.open == 4 and not any(
                g.idle for gs in gates.held.values() for g in gs), "never all reading bodies")
            await asyncio.sleep(0.4)  # past reclaim_stall_s
            assert await status(s.port) == honest
            assert s.aborted == ([Reason.OVER_SHARE] if watched else [])
        finally:
            for _, w in held:
                w.close()
