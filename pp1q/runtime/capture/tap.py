"""Recording a daemon's connections without touching its protocol code.

``tap(factory, writer)`` wraps an asyncio protocol factory: every connection it makes
is recorded whole (OPEN, every chunk in and out, CLOSE) and otherwise behaves exactly
as the wrapped protocol. Works for ``asyncio.Protocol`` (stream clients such as
``asyncio.open_connection``) and ``asyncio.BufferedProtocol`` (received bytes still
land straight in the wrapped protocol's own buffers; the tap records a view of them).

    server = await loop.create_server(tap(lambda: WorkerConnection(...), capture), host, port)
    _, proto = await loop.create_connection(tap(lambda: WireProtocol(...), capture), h, p)

Every connection is recorded as ``protocol`` (wire v2 unless given): since revision 2
the daemons speak nothing else on their sockets, so there is nothing to sniff.

Limit: a client made by ``asyncio.open_connection`` writes through the real transport
(its StreamWriter is built from what create_connection returns), so only what it
receives is recorded. No daemon makes one; a tool that does records its writes itself.
"""

from __future__ import annotations

import asyncio
import time

from pp1q.runtime.capture.format import Direction, Protocol
from pp1q.runtime.capture.writer import CaptureWriter


def tap(factory, writer: CaptureWriter | None, protocol: Protocol | str = Protocol.WIRE):
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
        self.name = str(protocol)
        self.conn: int | None = None
        self.peer = ""

    # -- recording -------------------------------------------------------------

    def record(self, direction: Direction, data) -> None:
        if self.writer.stopped:
            return
        if self.conn is not None:
            self.writer.record(direction, self.conn, None, data)

    def __getattr__(self, name):
        # the caller holds the wrapper (create_connection returns it): its attributes
        # (link's ``proto.transport``, a StreamWriter's ``_drain_helper``) are the inner's
        return getattr(self.inner, name)

    # -- asyncio.BaseProtocol ----------------------------------------------------

    def connection_made(self, transport) -> None:
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "")
        if not self.writer.stopped:
            self.conn = self.writer.open_conn(self.name, self.peer, time.monotonic_ns() / 1e9)
        self.inner.connection_made(_TappedTransport(transport, self))

    def connection_lost(self, exc) -> None:
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
