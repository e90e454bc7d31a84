"""The HTTP connection gate (pp1q.verifier.http_gate): one client address gets its share
of the connections and no more; a client that stops reading its answers loses its
connection after the write-stall deadline instead of holding it for good (and enough of
them no longer lock every other client out); a streamed request whose client stops
reading frees its slot when its generation ends, then its connection. From outside
through sockets, and the gate alone fed a transport's events."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from aiohttp import web
from daemon_harness import Pair
from fake_decider import FakeDecider
from fake_worker import FakeWorker
from http_gate_harness import GET, FedTransport, RecordingHandler, Served, admitted, connect, status
from link_harness import PROMPT, WAIT_S, linked, until
from wire_helpers import config

from pp1q.core.errors import Reason
from pp1q.runtime.address_counts import client_address
from pp1q.runtime.metrics import Metrics
from pp1q.runtime.settings import VerifierSettings
from pp1q.tools.chaos.rig import value
from pp1q.verifier.daemon import routes
from pp1q.verifier.http_gate import Gates
from pp1q.verifier.scheduler import Scheduler
from pp1q.verifier.server import Limits

pytestmark = pytest.mark.daemons  # binds servers on 127.0.0.1

def _send_buffer_max() -> int:
    """The most a socket's send buffer grows to here (Linux's tcp_wmem; 4 MiB default)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20


# pipelined requests a stalling client sends: answers (~280 bytes each) twice the most
# the server's socket buffers, so writing pauses (the client's own buffer is 4 KiB)
PIPELINED = 2 * _send_buffer_max() // 280


async def _stalling_client(port: int):
    """Pipelines PIPELINED requests and never reads an answer."""
    reader, writer = await connect(port, rcvbuf=4096)
    reader._transport.pause_reading()  # the client reads nothing, not even into its buffer
    writer.write(GET * PIPELINED)
    return writer


@pytest.mark.parametrize("stall_s, honest", [
    (0.5, (200, "")),
    (3600.0, (503, "busy")),  # no deadline in reach: the stalled clients hold every place
])
async def test_clients_that_stop_reading_lose_their_connections(stall_s, honest):
    # an idle connection closes after head_timeout_s: one still open past it is stuck
    limits = Limits(max_connections=3, max_connections_per_address=0, head_timeout_s=0.5,
                    write_stall_s=stall_s)
    async with Served(limits) as s:
        writers = [await _stalling_client(s.port) for _ in range(3)]
        try:
            gates = s.server.gates
            # every place taken, and each client's answers stuck: writing paused
            await until(lambda: gates.counts.open == 3 and all(
                w.transport.get_write_buffer_size() == 0 for w in writers), "never admitted")
            if stall_s < 60:
                await until(lambda: len(s.aborted) == 3, "the stalled clients kept their places")
                assert s.aborted == [Reason.CLIENT_STALLED] * 3
                await until(lambda: gates.counts.open == 0, "an aborted connection kept its place")
            else:
                await asyncio.sleep(1.5)  # past the head timeout: nothing left them
                assert s.aborted == [] and gates.counts.open == 3
            assert await status(s.port) == honest
        finally:
            for w in writers:
                w.close()


async def test_the_deadline_runs_from_a_pause_to_its_resume_only():
    """Writing paused then resumed (a client that reads) is never aborted; paused again,
    the deadline starts again, and runs again while the client takes some of what is
    unsent; a deadline in which it took nothing aborts the connection."""
    aborted: list[Reason] = []
    handlers: list[RecordingHandler] = []
    # margins of 4x between the sleeps and the deadline: a loaded CI machine's sleeps
    # overshoot (a 0.2 s deadline with 0.15 s sleeps failed once at load average 6)
    limits = Limits(write_stall_s=0.8)
    gates = Gates(limits, lambda: handlers.append(RecordingHandler()) or handlers[-1],
                  on_aborted=aborted.append)
    gate, transport = gates(), FedTransport()
    gate.connection_made(transport)
    gate.data_received(b"GET / HTTP/1.1\r\n\r\n")
    for _ in range(3):  # each pause resumed before its deadline, 0.6 s of pauses in all
        gate.pause_writing()
        await asyncio.sleep(0.2)
        gate.resume_writing()
    await asyncio.sleep(1.1)  # past any deadline a pause could have left running
    assert not transport.aborted and aborted == []
    assert transport.high == 0  # any byte unsent pauses writing
    gate.pause_writing()
    for _ in range(6):  # paused for 1.2 s, but the client takes some within each 0.8 s
        await asyncio.sleep(0.2)
        transport.buffered -= 100
    assert not transport.aborted and aborted == []
    await until(lambda: transport.aborted, "a connection that took nothing stayed")
    assert aborted == [Reason.CLIENT_STALLED]
    gate.connection_lost(None)  # what the transport's abort leads to
    assert handlers[0].events == ["made", "data"] + ["pause", "resume"] * 3 + ["pause", "lost"]
    assert gates.counts.open == 0 and gates.counts.by_address == {}


async def test_a_handler_that_fails_to_start_gives_its_place_back():
    def broken():
        raise RuntimeError("no handler")

    gates = Gates(Limits(), broken)
    gate, transport = gates(), FedTransport()
    with pytest.raises(RuntimeError):
        gate.connection_made(transport)
    assert transport.aborted and gates.counts.open == 0 and gates.counts.by_address == {}
    gate.connection_lost(None)  # what the abort leads to: nothing released twice
    assert gates.counts.open == 0


class _NoReclaim(Gates):
    """The gate before reclaiming: with every place held, a new address is refused."""

    def reclaim(self, address: str) -> bool:
        return False


async def test_a_new_address_takes_a_stalled_place_from_the_address_holding_the_most():
    """Every place held: a client holding two fewer than another address takes one of
    its places whose client has taken nothing for reclaim_stall_s (of the address holding
    the most, the one longest without a read); one holding one fewer does not (no places
    taken back and forth), nor does anyone where every client reads or has just paused."""
    aborted: list[Reason] = []
    refused: list[Reason] = []
    limits = Limits(max_connections=5, max_connections_per_address=0, write_stall_s=60,
                    reclaim_stall_s=0.3)
    gates = Gates(limits, RecordingHandler, on_refused=refused.append, on_aborted=aborted.append)
    a = [admitted(gates, "10.0.0.1") for _ in range(3)]
    b = [admitted(gates, "10.0.0.2") for _ in range(2)]
    b[0][0].pause_writing()  # b's client is not reading: but b holds fewer than a
    a[2][0].pause_writing()
    a[1][0].pause_writing()
    early = admitted(gates, "10.0.0.9")  # the stalls too fresh: refused
    assert early[1].closed and refused == [Reason.TOO_MANY_CONNECTIONS] and aborted == []
    await asyncio.sleep(0.35)  # past reclaim_stall_s
    a[1][0].resume_writing()  # a[1]'s client read: its stall starts again
    a[1][0].pause_writing()
    c1 = admitted(gates, "10.0.0.3")
    assert aborted == [Reason.OVER_SHARE] and not c1[1].closed
    assert [t.aborted for _, t in a + b] == [False, False, True, False, False]
    assert gates.counts.by_address == {"10.0.0.1": 2, "10.0.0.2": 2, "10.0.0.3": 1}
    c2 = admitted(gates, "10.0.0.3")  # c holds 1, a and b 2: refused
    assert c2[1].closed and refused == [Reason.TOO_MANY_CONNECTIONS] * 2
    d1 = admitted(gates, "10.0.0.4")  # a and b hold 2; only b[0] stalled long enough
    assert [t.aborted for _, t in a + b] == [False, False, True, True, False]
    assert not d1[1].closed and aborted == [Reason.OVER_SHARE] * 2
    e1 = admitted(gates, "10.0.0.5")  # a[1] has stalled too briefly: refused
    assert e1[1].closed and refused == [Reason.TOO_MANY_CONNECTIONS] * 3
    await asyncio.sleep(0.35)
    e2 = admitted(gates, "10.0.0.5")  # now a[1], of the one address holding 2
    assert [t.aborted for _, t in a + b] == [False, True, True, True, False]
    assert not e2[1].closed
    f1 = admitted(gates, "10.0.0.6")  # one each now, and nobody stalled: refused
    assert f1[1].closed and refused == [Reason.TOO_MANY_CONNECTIONS] * 4
    assert gates.counts.by_address == {f"10.0.0.{i}": 1 for i in range(1, 6)}
    for gate, _ in a + b + [early, c1, c2, d1, e1, e2, f1]:  # what each abort leads
        gate.connection_lost(None)  # to: nothing released twice
    assert gates.counts.open == 0 and gates.held == {} and gates.stalled == {}


class _Reading(FedTransport):
    """A client that takes ``pace`` bytes of its waiting answer between two looks: a
    progress check sees it read that much, however the loop's timers fall."""

    def __init__(self, peer: str, pace: int) -> None:
        super().__init__(peer)
        self.pace = pace
        self.buffered = 1 << 40

    def get_write_buffer_size(self) -> int:
        self.buffered -= self.pace
        return self.buffered


async def test_a_drip_feeding_reader_is_taken_and_a_fast_one_is_not():
    """Readers that take a byte before every progress check keep their connections
    from the write-stall deadline, but not from a newcomer: below RECLAIM_MIN_BPS they
    are slow. A client reading its waiting answer fast is never taken."""
    aborted: list[Reason] = []
    refused: list[Reason] = []
    limits = Limits(max_connections=4, max_connections_per_address=0, write_stall_s=0.4,
                    reclaim_stall_s=0.25)  # checks every 0.1 s
    gates = Gates(limits, RecordingHandler, on_refused=refused.append, on_aborted=aborted.append)

    def reader(peer: str, pace: int):
        gate, transport = gates(), _Reading(peer, pace)
        gate.connection_made(transport)
        gate.pause_writing()
        return gate, transport

    fast = [reader("10.0.0.1", 10**6) for _ in range(2)]  # 10 MB a check
    drip = [reader("10.0.0.2", 1) for _ in range(2)]  # a byte a check
    await asyncio.sleep(0.7)  # past the deadline: none stalled, each took bytes
    assert aborted == [] and all(g.slow_since is not None for g, _ in drip)
    assert all(g.slow_since is None for g, _ in fast)
    newcomer = admitted(gates, "10.0.0.3")
    assert aborted == [Reason.OVER_SHARE] and not newcomer[1].closed
    assert [t.aborted for _, t in fast + drip] == [False, False, True, False]
    other = admitted(gates, "10.0.0.4")  # only the fast readers hold two now
    assert other[1].closed and refused == [Reason.TOO_MANY_CONNECTIONS]
    for gate, _ in fast + drip + [newcomer, other]:
        gate.connection_lost(None)
    assert gates.counts.open == 0 and gates.stalled == {}


class _CountedScans(dict):
    """The stalled table, counting the scans reclaim makes of it."""

    scans = 0

    def items(self):
        self.scans += 1
        return super().items()


async def test_a_flood_of_refused_newcomers_costs_one_scan_an_interval():
    refused: list[Reason] = []
    gates = Gates(Limits(max_connections=8, max_connections_per_address=0),
                  RecordingHandler, on_refused=refused.append)
    gates.stalled = _CountedScans()
    held = [admitted(gates, "10.0.0.1") for _ in range(8)]
    for gate, _ in held:  # every place stalled, none for long enough to be taken
        gate.pause_writing()
    for i in range(200):
        admitted(gates, f"10.1.{i // 250}.{i % 250}")
    assert refused == [Reason.TOO_MANY_CONNECTIONS] * 200
    assert gates.stalled.scans == 1  # the first newcomer's; the rest within the gap
    await asyncio.sleep(0.15)  # past RECLAIM_SCAN_GAP_S
    admitted(gates, "10.2.0.1")
    assert gates.stalled.scans == 2
    for gate, _ in held:
        gate.connection_lost(None)


async def _slow_reader(port: int, source: str):
    """A client from ``source`` that asks for answers larger than the buffers and reads
    them too slowly to empty them (here: not at all)."""
    reader, writer = await connect(port, source, rcvbuf=4096)
    reader._transport.pause_reading()
    writer.write(GET * PIPELINED)
    return writer


@pytest.mark.parametrize("make_gates, honest", [
    (Gates, (200, "")),
    (_NoReclaim, (503, "busy")),  # the lock-out reclaiming ends
])
async def test_slow_readers_at_two_addresses_do_not_lock_a_third_out(
        make_gates, honest, monkeypatch):
    monkeypatch.setattr("pp1q.verifier.server.Gates", make_gates)
    # the deadline out of reach, as for clients that take a byte within each
    limits = Limits(max_connections=4, max_connections_per_address=2, head_timeout_s=0.5,
                    write_stall_s=3600.0, reclaim_stall_s=0.5)
    async with Served(limits) as s:
        writers = [await _slow_reader(s.port, source)
                   for source in ("127.0.0.2", "127.0.0.3") for _ in range(2)]
        try:
            gates = s.server.gates
            await until(lambda: gates.counts.open == 4 and len(gates.stalled) == 4,
                        "the slow readers never held every place")
            await asyncio.sleep(0.6)  # past reclaim_stall_s
            assert await status(s.port) == honest
            if make_gates is Gates:
                assert s.aborted == [Reason.OVER_SHARE] and s.refused == []
            else:
                assert s.aborted == [] and s.refused == [Reason.TOO_MANY_CONNECTIONS]
        finally:
            for w in writers:
                w.close()


@pytest.mark.parametrize("peer, counted_as", [
    (("192.0.2.7", 5000), "192.0.2.7"),
    (("::ffff:192.0.2.7", 5000, 0, 0), "192.0.2.7"),  # IPv4 on a dual-stack socket
    (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),  # one client's /64
    (("2001:db8:1:2:bbbb::9", 5000, 0, 0), "2001:db8:1:2::/64"),
    (("fe80::1%eth0", 5000, 0, 2), "fe80::/64"),
    (None, "None"),
])
def test_the_address_a_connection_counts_against(peer, counted_as):
    assert client_address(peer) == counted_as


async def test_a_refused_connection_is_answered_and_never_reaches_the_handler():
    refused: list[Reason] = []
    made: list[RecordingHandler] = []
    gates = Gates(Limits(max_connections=1), lambda: made.append(RecordingHandler()) or made[-1],
                  on_refused=refused.append)
    first, second = gates(), gates()
    first.connection_made(FedTransport())
    transport = FedTransport("10.0.0.9")
    second.connection_made(transport)
    second.data_received(b"GET / HTTP/1.1\r\n\r\n")
    second.pause_writing()  # no deadline for a connection never admitted
    second.connection_lost(None)
    assert refused == [Reason.TOO_MANY_CONNECTIONS] and len(made) == 1
    assert transport.closed and transport.sent.startswith(b"HTTP/1.1 503 ")
    # OpenAI's error object, as every other refusal's (the client reads type and param)
    assert json.loads(transport.sent.split(b"\r\n\r\n", 1)[1]) == {"error": {
        "message": "too many connections", "type": "server_error", "param": None,
        "code": "busy"}}
    assert gates.counts.open == 1 and gates.counts.by_address == {"127.0.0.1": 1}
    first.connection_lost(None)
    assert gates.counts.open == 0 and gates.counts.by_address == {}


async def test_a_client_that_reads_slowly_keeps_its_connection():
    """An 8 MB answer taken 1 MiB at a time with pauses of a third of the deadline:
    writing stays paused far longer than the deadline, but the client acknowledges bytes
    within each (through the socket: TCP_INFO on Linux), so it is never aborted."""
    size, chunk = 8 << 20, 1 << 20

    async def big(_request):
        return web.Response(body=b"x" * size)

    async with Served(Limits(write_stall_s=1.0), {("GET", "/big"): big}) as s:
        reader, writer = await connect(s.port, rcvbuf=4096)
        writer.write(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
        got = 0  # bytes of the body
        try:
            async with asyncio.timeout(WAIT_S * 3):
                await reader.readuntil(b"\r\n\r\n")
                while got < size:
                    want = min(got + chunk, size)
                    while got < want:
                        data = await reader.read(1 << 16)
                        assert data, "the server closed a connection whose client reads"
                        got += len(data)
                    await asyncio.sleep(0.3)
        finally:
            writer.close()
        assert s.aborted == []


async def test_one_address_gets_its_share_of_the_connections():
    limits = Limits(max_connections=8, max_connections_per_address=2, head_timeout_s=10)
    async with Served(limits) as s:
        held = [await connect(s.port) for _ in range(2)]
        await until(lambda: s.server.gates.counts.open == 2, "never admitted")
        assert await status(s.port) == (503, "busy")
        assert s.refused == [Reason.TOO_MANY_CONNECTIONS_FROM_ADDRESS]
        assert await status(s.port, "127.0.0.2") == (200, "")  # another client is served
        held[0][1].close()
        await until(lambda: s.server.gates.counts.by_address == {"127.0.0.1": 1}, "never released")
        assert await status(s.port) == (200, "")  # a place of its own again
        held[1][1].close()
        await until(lambda: s.server.gates.counts.by_address == {},
                    "the table kept a closed address")


async def test_no_per_address_bound_when_it_is_zero():
    limits = Limits(max_connections=4, max_connections_per_address=0, head_timeout_s=10)
    async with Served(limits) as s:
        held = [await connect(s.port) for _ in range(3)]
        assert await status(s.port) == (200, "")
        await until(lambda: s.server.gates.counts.open == 3, "a closed connection kept its place")
        held.append(await connect(s.port))
        await until(lambda: s.server.gates.counts.open == 4, "never admitted")
        assert await status(s.port) == (503, "busy")  # the server's bound still holds
        assert s.refused == [Reason.TOO_MANY_CONNECTIONS]
        for _, w in held:
            w.close()


class _WideText:
    """A target's text in which each token is WIDE characters: a streamed answer of a
    few dozen tokens is then megabytes, past what the sockets' buffers take."""

    WIDE = 100_000
    eos_ids = frozenset()

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        return PROMPT

    def decode(self, ids: list[int]) -> str:
        return "x" * (self.WIDE * len(ids))


async def test_a_streamed_client_that_stops_reading_frees_its_slot_then_its_connection():
    worker = FakeWorker()
    metrics = Metrics("verifier")
    async with linked(worker, metrics) as link:
        scheduler = Scheduler(link, FakeDecider(), metrics, slots=1, depth=3, text=_WideText())
        served = Served(Limits(write_stall_s=2.0),
                         routes(VerifierSettings(), link, scheduler, config(versions=(2,))))
        async with served as s:
            assert await link.wait_ready(WAIT_S)
            body = json.dumps({"prompt": PROMPT, "max_tokens": 64, "temperature": 0,
                               "stream": True}).encode()
            reader, writer = await connect(s.port, rcvbuf=4096)
            reader._transport.pause_reading()
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                         b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            try:
                # the generation ends and frees its slot although the client read nothing
                await until(lambda: metrics.value("pp1q_requests_total", outcome="ok") == 1,
                            "the request never finished")
                assert metrics.value("pp1q_slots_in_use") == 0
                assert s.server.gates.counts.open == 1  # its answer still unsent
                assert s.aborted == []
                await until(lambda: s.aborted, "the stalled stream kept its connection")
                assert s.aborted == [Reason.CLIENT_STALLED]
                await until(lambda: s.server.gates.counts.open == 0,
                            "the connection kept its place")
            finally:
                writer.close()


def test_the_daemon_gives_the_gate_its_setting_and_counts_its_refusals(tmp_path):
    """``http_connections_per_address`` reaches the verifier's gate, and a refusal is in
    its metrics (a real verifier process; the worker is not needed)."""
    pair = Pair(tmp_path, verifier_args=["--http-connections-per-address", "1"], wait=False)
    port = pair.verifier.port
    try:
        with socket.create_connection(("127.0.0.1", port), WAIT_S) as held:
            held.settimeout(WAIT_S)
            held.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
            assert held.recv(12) == b"HTTP/1.1 200"  # answered, kept alive: its one place
            with socket.create_connection(("127.0.0.1", port), WAIT_S) as extra:
                extra.settimeout(WAIT_S)
                raw = b""
                while chunk := extra.recv(4096):
                    raw += chunk
            assert raw.startswith(b"HTTP/1.1 503") and b"from this address" in raw
            m = pair.metrics("verifier")
        assert value(m, "pp1q_requests_refused_total",
                     reason="too_many_connections_from_address") == 1
    finally:
        pair.close()

