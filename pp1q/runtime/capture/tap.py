"""Recording a daemon's connections without touching its protocol code.

``tap(factory, writer)`` wraps an asyncio protocol factory: every connection it makes
is recorded whole (OPEN, every chunk in and out, CLOSE) and otherwise behaves exactly
as the wrapped protocol. Works for ``asyncio.Protocol`` (stream clients such as
``asyncio.open_connection``) and ``asyncio.BufferedProtocol`` (received bytes still
land straight in the wrapped protocol's own buffers; the tap records a view of them).

    server = await loop.create_server(tap(lambda: WorkerConnection(...), capture), host, port)
    _, proto = await loop.create_connection(tap(lambda: _WireProtocol(...), capture), h, p)

The protocol name (wire or context channel) is read from the first bytes of the
connection (``pp1q.wire.sniff``) unless given; records
wait for those bytes, then OPEN and they are written with their original times.

Limit: a client made by ``asyncio.open_connection`` writes through the real transport
(its StreamWriter is built from what create_connection returns), so only what it
receives is recorded; such a connection (the verifier's context channel) is named
"unknown" unless ``protocol`` is given. Record its writes where they are made.
"""

from __future__ import annotations

import asyncio
import time

from pp1q.runtime.capture.format import Direction, Protocol
from pp1q.runtime.capture.writer import CaptureWriter
from pp1q.wire import SNIFF_BYTES, Stream, sniff

UNKNOWN = Stream.UNKNOWN.value  # neither preamble nor wire magic first: replay shows it raw
_PROTOCOL = {Stream.WIRE: Protocol.WIRE, Stream.CONTEXT: Protocol.CONTEXT}


def tap(factory, writer: CaptureWriter | None, protocol: Protocol | str | None = None):
    """A factory for recorded protocols; ``writer`` None: ``factory`` itself (no cost)."""
    if writer is None:
        return factory

    def make():
        inner = factory()
        cls = _TapBuffered if isinstance(inner, asyncio.BufferedProtocol) else _TapStream
        return cls(inner, writer, protocol)
    return make


class _TappedTransport:
    """The transport the wrapped protocol sees: writes are recorded, the rest delegated."""

    def __init__(self, transport, tap: _TapBase) -> None:
        self._transport, self._tap = transport, tap

    def write(self, data) -> None:
        self._tap.record(Direction.OUT, data)
        self._transport.write(data)

    def writelines(self, chunks) -> None:
        for c in chunks:
            self.write(c)

    def __getattr__(self, name):
        return getattr(self._transport, name)


class _TapBase:
    def __init__(self, inner, writer: CaptureWriter, protocol) -> None:
        self.inner, self.writer = inner, writer
        self.name = None if protocol is None else str(protocol)
        self.conn: int | None = None
        self.peer = ""
        self._pending: list[tuple[Direction, int, bytes]] = []
        self._first = bytearray()  # first bytes of the connection, for the protocol name

    # -- recording -------------------------------------------------------------

    def record(self, direction: Direction, data) -> None:
        if self.writer.stopped:
            return
        if self.conn is not None:
            self.writer.record(direction, self.conn, None, data)
            return
        t = time.monotonic_ns()
        chunk = bytes(data)
        self._pending.append((direction, t, chunk))
        if not self._first or self._pending[0][0] is direction:
            self._first += chunk[:SNIFF_BYTES - len(self._first)]
        if len(self._first) >= SNIFF_BYTES:
            self._open(UNKNOWN)

    def _open(self, fallback: str) -> None:
        name = self.name
        if name is None:
            name = _PROTOCOL.get(sniff(self._first), fallback)
        t0 = self._pending[0][1] if self._pending else time.monotonic_ns()
        self.conn = self.writer.open_conn(name, self.peer, t0 / 1e9)
        for direction, t, chunk in self._pending:
            self.writer.record(direction, self.conn, t / 1e9, chunk)
        self._pending.clear()

    def __getattr__(self, name):
        # the caller holds the wrapper (create_connection returns it): its attributes
        # (link's ``proto.transport``, a StreamWriter's ``_drain_helper``) are the inner's
        return getattr(self.inner, name)

    # -- asyncio.BaseProtocol ----------------------------------------------------

    def connection_made(self, transport) -> None:
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "")
        if self.name is not None:
            self._open(self.name)
        self.inner.connection_made(_TappedTransport(transport, self))

    def connection_lost(self, exc) -> None:
        if self.conn is None and not self.writer.stopped:
            self._open(UNKNOWN)
        if self.conn is not None:
            self.writer.close_conn(self.conn, "lost: " + repr(exc) if exc else "closed")
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def eof_received(self):
        return self.inner.eof_received()


class _TapStream(_TapBase, asyncio.Protocol):
    def data_received(self, data) -> None:
        self.record(Direction.IN, data)
        self.inner.data_received(data)


class _TapBuffered(_TapBase, asyncio.BufferedProtocol):
    _view: memoryview | None = None

    def get_buffer(self, sizehint: int):
        self._view = self.inner.get_buffer(sizehint)
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        self.record(Direction.IN, memoryview(self._view).cast("B")[:nbytes])
        self.inner.buffer_updated(nbytes)
