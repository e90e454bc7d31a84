"""Which HTTP connections aiohttp gets, and which it loses: the server's connection gate.

Every accepted connection first meets a ``Gate``, an asyncio protocol in front of
aiohttp's request handler. Over one client address's share of the server's connection
bound, the connection is answered one 503 and closed unparsed, so that one client
opening connections (or holding them for the head timeout, again and again) cannot take
every connection from the others. Over the server's bound, too, unless ``reclaim`` finds
it a place: a connection of an address holding at least two more that is idle (waiting
for its next request, nothing in its kernel queues: closing it loses nothing, as nginx
drains its idle keep-alive connections when full), or whose client has taken its
waiting answer slower than RECLAIM_MIN_BPS, or has not sent its request's body, for
``reclaim_stall_s``, aborted, so that a few addresses holding every place, cycling cheap
requests, trickling bodies or reading slowly on purpose (which no deadline can tell from
a slow honest client), cannot lock a new address out; a connection whose request is
being answered, to a client reading at a fair pace, is never taken. An admitted
connection's events all go to aiohttp, and the gate watches the one thing aiohttp
leaves unbounded: a client that stops reading. Its answers then
wait unsent, the handler waits in ``drain`` (or the closing transport waits to flush)
for ever, holding the connection; pipelined requests make the answers as large as
needed. The gate sets the transport's high-water mark to 0, so that any byte the socket
does not take at once pauses writing, and from each pause runs a deadline of
``write_stall_s`` that each byte the client takes restarts (acknowledged bytes, from the
kernel's TCP_INFO, checked four times a deadline); a client that took nothing for that
long is aborted and counted. That is nginx's ``send_timeout``: a bound on the time
between two reads of the client's, not on a whole answer.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import json
import socket
import struct
import sys
import termios
from collections.abc import Callable
from typing import Protocol

from pp1q.core.errors import Reason
from pp1q.runtime.address_counts import AddressCounts, client_address
from pp1q.verifier.http import HttpError, error_body

# a connection with bytes unsent whose client takes none of them for this long is
# aborted (a client that stopped reading holds its connection for ever otherwise)
WRITE_STALL_S = 30.0
CHECKS_PER_DEADLINE = 4  # progress checks a deadline: aborted 30-37.5 s after the last read
# a connection whose client has taken its waiting answer slower than RECLAIM_MIN_BPS for
# this long (as of the progress checks) can be given to an address holding fewer: two
# checks' intervals, so that one slow interval (a pause, a busy client) is not enough
RECLAIM_STALL_S = 15.0
# the slowest honest reading a full server protects: 16 KiB/s (128 kbit/s). A client
# taking a few bytes before each check (the write-stall deadline's proof of life) is
# below it, so holding every place that way costs an attacker 512 x 16 KiB/s of reading
RECLAIM_MIN_BPS = 16 << 10
# after a reclaim scan found no connection to take, newcomers holding as many or more
# are refused without one for this long: a flood of refused connections costs one scan
# of the stalled connections per interval, not one each
RECLAIM_SCAN_GAP_S = 0.1


class GateLimits(Protocol):
    max_connections: int
    max_connections_per_address: int  # 0: no per-address bound (a proxy in front)
    write_stall_s: float
    reclaim_stall_s: float


def refusal(message: str) -> bytes:
    """One whole 503 answer with the API's error body (OpenAI's error object, as every
    refusal's); the connection closes after it."""
    body = json.dumps(error_body(HttpError(503, "busy", message)),
                      separators=(",", ":")).encode() + b"\n"
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


_REFUSED_FOR = {"open": Reason.TOO_MANY_CONNECTIONS,
                "address": Reason.TOO_MANY_CONNECTIONS_FROM_ADDRESS}
REFUSALS = {  # the reason counted, and the answer sent, for each kind of refused connection
    Reason.TOO_MANY_CONNECTIONS: refusal("too many connections"),
    Reason.TOO_MANY_CONNECTIONS_FROM_ADDRESS: refusal("too many connections from this address"),
}


# struct tcp_info's tcpi_bytes_acked (Linux >= 4.1): a u64 at byte 120, the bytes the
# peer has acknowledged on this connection, which only its reading lets grow
_TCP_INFO_BYTES_ACKED = 120


def bytes_taken(transport: asyncio.Transport) -> int:
    """A count that grows whenever the client takes some of what was written: the bytes
    it acknowledged (Linux's TCP_INFO), or where that cannot be read, minus the bytes
    still in the transport's buffer (which grows with new writes too: the cruder proof)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sys.platform.startswith("linux"):  # the layout is Linux's
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        except (OSError, ValueError):
            info = b""  # closed, or not TCP
        if len(info) >= _TCP_INFO_BYTES_ACKED + 8:
            return struct.unpack_from("Q", info, _TCP_INFO_BYTES_ACKED)[0]
    return -transport.get_write_buffer_size()


# the socket's kernel queues (Linux): bytes written but not yet acknowledged by the client
# (SIOCOUTQ, which is TIOCOUTQ), and bytes arrived but not yet read (FIONREAD)
_KERNEL_QUEUES = tuple(getattr(termios, name, None) for name in ("TIOCOUTQ", "FIONREAD"))


def kernel_queues_empty(transport: asyncio.Transport) -> bool:
    """Whether nothing waits in the connection's kernel queues: the client acknowledged
    every byte written, and sent nothing the loop has not read yet. An idle connection
    with either is not idle: closing it with a request unread sends an RST, which also
    drops the answer still queued for the client. A transport without a socket (a test's)
    has no queues; one whose queues cannot be read (another OS) is never idle."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return True
    if None in _KERNEL_QUEUES:
        return False
    for request in _KERNEL_QUEUES:
        count = array.array("i", [0])
        try:
            fcntl.ioctl(sock.fileno(), request, count)
        except (OSError, ValueError):
            return False
        if count[0]:
            return False
    return True


class Gates:
    """The open connections, by client address, and what makes a new one's protocol.

    ``make_handler()``: aiohttp's protocol for an admitted connection;
    ``on_refused(reason)``: a connection answered 503 unparsed;
    ``on_aborted(reason)``: an admitted connection aborted (``Reason.CLIENT_STALLED``,
    ``Reason.OVER_SHARE``, ``Reason.IDLE_OVER_SHARE``);
    ``waiting_for_request(handler)``: whether the handler ``make_handler`` made is idle,
    waiting for its connection's next request with nothing in progress (the gate sees
    bytes, not requests; without it no idle connection is taken).
    """

    def __init__(self, limits: GateLimits, make_handler: Callable[[], asyncio.Protocol],
                 on_refused: Callable[[Reason], None] | None = None,
                 on_aborted: Callable[[Reason], None] | None = None,
                 waiting_for_request: Callable[[asyncio.Protocol], bool] | None = None) -> None:
        self.limits = limits
        self.make_handler = make_handler
        self.waiting_for_request = waiting_for_request or (lambda _handler: False)
        self.on_refused = on_refused or (lambda _reason: None)
        self.on_aborted = on_aborted or (lambda _reason: None)
        self.counts = AddressCounts(limits.max_connections, limits.max_connections_per_address)
        # the admitted connections by address, oldest first (dicts as ordered sets): whom
        # ``reclaim`` can take a place from; holds exactly what ``counts`` counts
        self.held: dict[str, dict[Gate, None]] = {}
        # the admitted connections whose writing is paused, by gate: their address (the
        # slow readers among them can be reclaimed; kept apart so that a refusal need not
        # look at every place for them)
        self.stalled: dict[Gate, str] = {}
        # the admitted connections whose handler waits for its request's body, by gate:
        # their address (a body that trickles in is as slow as an answer that does)
        self.receiving: dict[Gate, str] = {}
        self._no_victim = (0.0, 0)  # (until when, for newcomers' floors from this one up)

    def __call__(self) -> Gate:
        return Gate(self)

    def admit(self, gate: Gate, address: str) -> Reason | None:
        """Take a place for ``gate``, a connection from ``address``, or say why there is
        none; with every place held, first try to ``reclaim`` one for it."""
        full = self.counts.admit(address)
        if full == "open" and self.reclaim(address):
            full = self.counts.admit(address)
        if full is not None:
            return _REFUSED_FOR[full]
        self.held.setdefault(address, {})[gate] = None
        return None

    def reclaim(self, address: str) -> bool:
        """Abort a connection of an address holding at least two more than ``address``
        (so that the two then differ by at most what they did, and two addresses never
        take places back and forth): of the address holding the most among those with
        one to take, an idle one (waiting for its next request) or else the one slow the
        longest (its answer waits unsent and its client has taken it slower than
        RECLAIM_MIN_BPS for ``reclaim_stall_s``). A connection whose request is being
        answered, to a client reading faster, is never taken. True if one was aborted."""
        floor = self.counts.by_address.get(address, 0) + 2
        now = asyncio.get_running_loop().time()
        until, from_floor = self._no_victim
        if now < until and floor >= from_floor:
            return False  # scanned a moment ago for as wide a floor: nothing to take
        slow, slow_count = self._slowest(floor, now - self.limits.reclaim_stall_s)
        idle, idle_count = self._idle(max(floor, slow_count))
        if idle is not None:  # from an address holding as many as the slow one's, or more
            idle.abort(Reason.IDLE_OVER_SHARE)
            return True
        if slow is not None:
            slow.abort(Reason.OVER_SHARE)
            return True
        self._no_victim = (now + RECLAIM_SCAN_GAP_S, floor)
        return False

    def _slowest(self, floor: int, latest: float) -> tuple[Gate | None, int]:
        """The slow connection to take of addresses holding ``floor`` or more (its answer
        waits, taken too slowly, or its handler waits for the request's body): of the
        address holding the most, the one slow since the earliest (no later than
        ``latest``); and how many its address holds (0: none)."""
        victim, best = None, None
        for table in (self.stalled, self.receiving):
            for gate, held_by in table.items():
                count, since = self.counts.by_address[held_by], gate.slow_since
                if count >= floor and since is not None and since <= latest:
                    rank = (-count, since)
                    if best is None or rank < best:
                        victim, best = gate, rank
        return victim, (-best[0] if best is not None else 0)

    def _idle(self, floor: int) -> tuple[Gate | None, int]:
        """An idle connection of the address holding the most among those holding
        ``floor`` or more with one (its oldest), and how many that address holds."""
        by_count = sorted(((count, address) for address, count in self.counts.by_address.items()
                           if count >= floor), reverse=True)
        for count, address in by_count:
            for gate in self.held[address]:
                if gate.idle:
                    return gate, count
        return None, 0

    def release(self, gate: Gate, address: str) -> None:
        self.counts.release(address)
        gates = self.held[address]
        del gates[gate]
        if not gates:
            del self.held[address]  # open addresses only, as ``counts``


class Gate(asyncio.Protocol):
    """One connection: refused at ``connection_made``, or aiohttp's with a stall deadline."""

    def __init__(self, gates: Gates) -> None:
        self._gates = gates
        self._inner: asyncio.Protocol | None = None  # aiohttp's handler, once admitted
        self._address: str | None = None  # once admitted, till released
        self._transport: asyncio.Transport | None = None
        self._stall: asyncio.TimerHandle | None = None
        self._taken = 0  # bytes_taken at the last check
        self._last_taken_at = 0.0  # when it last grew (the loop's clock)
        self._checked_at = 0.0  # when the last check (or the pause) was
        self._slow_since: float | None = None  # since when every check found it slow
        self._body_since: float | None = None  # since when its handler waits for a body

    def connection_made(self, transport) -> None:
        self._transport = transport
        address = client_address(transport.get_extra_info("peername"))
        refused = self._gates.admit(self, address)
        if refused is not None:
            self._gates.on_refused(refused)
            transport.write(REFUSALS[refused])
            transport.close()
            return
        self._address = address
        try:
            # any byte left unsent pauses writing, which starts the deadline: with the
            # default 64 KiB mark a closing connection with less left unsent never paused
            transport.set_write_buffer_limits(high=0)
            self._inner = self._gates.make_handler()
            self._inner.connection_made(transport)
        except BaseException:
            self._release()
            self._inner = None
            transport.abort()
            raise

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:  # a refused connection's bytes are never read
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            if self._stall is None:
                self._start_deadline()
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._cancel_stall()
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_stall()
        self._release()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def _release(self) -> None:
        self._gates.receiving.pop(self, None)
        if self._address is not None:
            self._gates.release(self, self._address)
            self._address = None

    def awaiting_body(self, waiting: bool) -> None:
        """The handler starts (True) or stops (False) waiting for its request's body
        (pp1q.verifier.server.read_body): while it waits, the connection is as slow as
        its client's body, from the start of the wait."""
        if waiting and self._address is not None:
            self._body_since = asyncio.get_running_loop().time()
            self._gates.receiving[self] = self._address
        else:
            self._body_since = None
            self._gates.receiving.pop(self, None)

    @property
    def idle(self) -> bool:
        """Admitted, nothing waiting unsent, and aiohttp waiting for the next request:
        aborting it loses no answer (a client mid-way through a request head loses that
        head, as at aiohttp's head timeout)."""
        return (self._inner is not None and self._address is not None and self._stall is None
                and self._gates.waiting_for_request(self._inner)
                and kernel_queues_empty(self._transport))

    @property
    def slow_since(self) -> float | None:
        """While writing is paused: since when the client has taken its answer slower
        than RECLAIM_MIN_BPS at every check (from the pause on, until a check finds it
        faster); while the handler waits for its request's body, since the wait began;
        None otherwise (or before the connection was admitted)."""
        if self._stall is not None:
            return self._slow_since
        return self._body_since

    def abort(self, reason: Reason) -> None:
        """Drop this admitted connection now, its place free at once (the transport's
        ``connection_lost`` comes later and releases nothing twice), and count why."""
        assert self._transport is not None
        self._cancel_stall()
        self._release()
        self._transport.abort()  # connection_lost follows: aiohttp cancels the handler
        self._gates.on_aborted(reason)

    def _start_deadline(self) -> None:
        assert self._transport is not None and self._address is not None
        self._gates.stalled[self] = self._address
        self._taken = bytes_taken(self._transport)
        now = asyncio.get_running_loop().time()
        self._last_taken_at = self._checked_at = self._slow_since = now
        self._check_later()

    def _check_later(self) -> None:
        # checked CHECKS_PER_DEADLINE times a deadline: a client that stopped reading is
        # aborted within 1.25 x write_stall_s of its last byte taken, not 2 x (the bytes
        # the kernel still delivers just after a pause would restart a single deadline)
        self._stall = asyncio.get_running_loop().call_later(
            self._gates.limits.write_stall_s / CHECKS_PER_DEADLINE, self._check)

    def _cancel_stall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        self._gates.stalled.pop(self, None)

    def _check(self) -> None:
        assert self._transport is not None
        now = asyncio.get_running_loop().time()
        taken = bytes_taken(self._transport)
        if taken > self._taken:  # the client took some: the clock restarts
            self._last_taken_at = now
        if taken - self._taken >= RECLAIM_MIN_BPS * (now - self._checked_at):
            self._slow_since = None  # reading at a pace a full server protects
        elif self._slow_since is None:
            self._slow_since = self._checked_at
        self._taken, self._checked_at = taken, now  # (the fallback's count also falls
        # when more is written)
        if now - self._last_taken_at < self._gates.limits.write_stall_s:
            self._check_later()
            return
        self._stall = None
        self.abort(Reason.CLIENT_STALLED)
