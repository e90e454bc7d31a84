"""Which HTTP connections aiohttp gets, and which it loses: the server's connection gate.

Every accepted connection first meets a ``Gate``, an asyncio protocol in front of
aiohttp's request handler. Over the server's connection bound, or over one client
address's share of it, the connection is answered one 503 and closed unparsed, so that
one client opening connections (or holding them for the head timeout, again and again)
cannot take every connection from the others. An admitted connection's events all go to
aiohttp, and the gate watches the one thing aiohttp leaves unbounded: a client that
stops reading. Its response then sits in the transport's buffer, writing paused, and
the handler waits in ``drain`` forever, holding the connection (pipelined requests make
any response as large as needed). A connection whose writing stays paused for
``write_stall_s`` is aborted and counted; a client that keeps reading, even slowly,
ends each pause (its buffers drain below their low mark) well within that time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from pp1q.core.errors import Reason

# open connections; more are answered 503 and closed. Bounds file descriptors and the
# requests parsed at once (with their bodies: pp1q.verifier.server.MAX_BODY_BYTES each)
MAX_CONNECTIONS = 512
# one client address's share of them: half, so that one client cannot take every
# connection from the others while a load generator on one machine (200 concurrent
# clients is common) still gets its share; behind a proxy every client has the proxy's
# address: raise it to MAX_CONNECTIONS, or 0 for no per-address bound
MAX_CONNECTIONS_PER_ADDRESS = 256
# a response whose client reads none of it for this long: the connection is aborted (a
# client that stopped reading holds its connection forever otherwise)
WRITE_STALL_S = 30.0


class GateLimits(Protocol):
    max_connections: int
    max_connections_per_address: int  # 0: no per-address bound (a proxy in front)
    write_stall_s: float


def refusal(message: str) -> bytes:
    """One whole 503 answer with the API's error body; the connection closes after it."""
    body = b'{"error":{"code":"busy","message":"%s"}}\n' % message.encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


REFUSALS = {  # the reason counted, and the answer sent, for each kind of refused connection
    Reason.TOO_MANY_CONNECTIONS: refusal("too many connections"),
    Reason.TOO_MANY_CONNECTIONS_FROM_ADDRESS: refusal("too many connections from this address"),
}


def client_address(peername: object) -> str:
    """The client's host: the first item of an IP peer name; anything else as a whole."""
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return str(peername)


class Gates:
    """The open connections, by client address, and what makes a new one's protocol.

    ``make_handler()``: aiohttp's protocol for an admitted connection;
    ``on_refused(reason)``: a connection answered 503 unparsed;
    ``on_aborted(reason)``: an admitted connection aborted (``Reason.CLIENT_STALLED``).
    """

    def __init__(self, limits: GateLimits, make_handler: Callable[[], asyncio.Protocol],
                 on_refused: Callable[[Reason], None] | None = None,
                 on_aborted: Callable[[Reason], None] | None = None) -> None:
        self.limits = limits
        self.make_handler = make_handler
        self.on_refused = on_refused or (lambda _reason: None)
        self.on_aborted = on_aborted or (lambda _reason: None)
        self.open = 0
        self.by_address: dict[str, int] = {}  # only addresses with a connection open

    def __call__(self) -> Gate:
        return Gate(self)

    def admit(self, address: str) -> Reason | None:
        """Take a place for a connection from ``address``, or say why there is none."""
        lim = self.limits
        if self.open >= lim.max_connections:
            return Reason.TOO_MANY_CONNECTIONS
        held = self.by_address.get(address, 0)
        if lim.max_connections_per_address and held >= lim.max_connections_per_address:
            return Reason.TOO_MANY_CONNECTIONS_FROM_ADDRESS
        self.open += 1
        self.by_address[address] = held + 1
        return None

    def release(self, address: str) -> None:
        self.open -= 1
        left = self.by_address[address] - 1
        if left:
            self.by_address[address] = left
        else:
            del self.by_address[address]  # the table holds open addresses only: bounded


class Gate(asyncio.Protocol):
    """One connection: refused at ``connection_made``, or aiohttp's with a stall deadline."""

    def __init__(self, gates: Gates) -> None:
        self._gates = gates
        self._inner: asyncio.Protocol | None = None  # aiohttp's handler, once admitted
        self._address = ""
        self._transport: asyncio.Transport | None = None
        self._stall: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self._transport = transport
        address = client_address(transport.get_extra_info("peername"))
        refused = self._gates.admit(address)
        if refused is not None:
            self._gates.on_refused(refused)
            transport.write(REFUSALS[refused])
            transport.close()
            return
        self._address = address
        self._inner = self._gates.make_handler()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:  # a refused connection's bytes are never read
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            if self._stall is None:
                self._stall = asyncio.get_running_loop().call_later(
                    self._gates.limits.write_stall_s, self._stalled)
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._cancel_stall()
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_stall()
        if self._inner is not None:
            self._gates.release(self._address)
            self._inner.connection_lost(exc)

    def _cancel_stall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _stalled(self) -> None:
        self._stall = None
        self._gates.on_aborted(Reason.CLIENT_STALLED)
        assert self._transport is not None
        self._transport.abort()  # connection_lost follows: aiohttp cancels the handler
