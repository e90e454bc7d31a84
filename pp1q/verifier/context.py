"""Verifier side of the context channel (see pp1q.wire.context_channel): hands the worker a
slot's committed prefix for a new generation and waits for the acknowledgement."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.core.outcomes import FallbackCause
from pp1q.core.prefix import Prefix
from pp1q.runtime.capture import Direction, Protocol
from pp1q.runtime.metrics import Metrics
from pp1q.runtime.tls import ClientTls, connect_kwargs
from pp1q.wire import context_channel as cc

log = logging.getLogger("pp1q.verifier")

_READ_BYTES = 64 * 1024  # answers are ~40 bytes; one read usually holds several


@dataclass(frozen=True)
class Fallback:
    """Why a proposal produced nothing consumable (pp1q.verifier.link uses it too)."""

    cause: FallbackCause
    reason: Reason
    detail: str = ""


class ContextClient:
    def __init__(self, metrics: Metrics, capture=None) -> None:
        self.metrics = metrics
        # pp1q.runtime.capture.CaptureWriter or None. asyncio.open_connection bypasses
        # capture.tap, so this channel records its own reads and writes.
        self._capture = capture
        self._conn: int | None = None  # this connection's id in the capture
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._waiters: dict[tuple[int, int], asyncio.Future] = {}
        self._timeout = 1.0
        self.closed: asyncio.Future = asyncio.get_running_loop().create_future()

    async def connect(self, host: str, port: int, timeout: float,
                      tls: ClientTls | None = None) -> None:
        """Open the channel (TLS as the wire connection when ``tls``; the handshake
        counts against ``timeout``)."""
        self._timeout = timeout
        reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, **connect_kwargs(tls)), timeout)
        if self._capture is not None:
            self._conn = self._capture.open_conn(Protocol.CONTEXT, f"{host}:{port}")
        self._write(cc.PREAMBLE)
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        decoder = cc.ContextDecoder()
        try:
            while data := await reader.read(_READ_BYTES):
                if self._conn is not None:
                    self._capture.record(Direction.IN, self._conn, None, data)
                for msg in decoder.feed(data):
                    fut = self._waiters.pop((msg.slot, msg.generation), None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
        except RemoteProtocolError as e:
            log.warning("context channel: invalid answer (%s)", e)
            self.metrics.validation_failure(e.reason)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.close()

    def _write(self, data: bytes) -> None:
        if self._conn is not None:
            self._capture.record(Direction.OUT, self._conn, None, data)
        self._writer.write(data)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._conn is not None:
            self._capture.close_conn(self._conn, "closed")
            self._conn = None
        if self._reader_task is not None and self._reader_task is not asyncio.current_task():
            self._reader_task.cancel()
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_result(None)  # None: the channel closed before an answer
        self._waiters.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    async def set_context(self, session: int, slot: int, generation: int, prefix: Prefix):
        """None when acknowledged, else a ``Fallback`` saying why not."""
        if self.closed.done():
            return Fallback(FallbackCause.CONNECTION_LOST, Reason.CONNECTION_LOST)
        fut = asyncio.get_running_loop().create_future()
        self._waiters[(slot, generation)] = fut
        self._write(cc.encode(cc.SetContext(session, slot, generation, prefix.tokens,
                                            prefix.digest)))
        try:
            answer = await asyncio.wait_for(fut, self._timeout)
        except TimeoutError:
            self._waiters.pop((slot, generation), None)
            self.metrics.watchdog_timeouts.inc()
            return Fallback(FallbackCause.WATCHDOG_TIMEOUT, Reason.STEP_TIMEOUT, "context ack")
        if answer is None:
            return Fallback(FallbackCause.CONNECTION_LOST, Reason.CONNECTION_LOST)
        if isinstance(answer, cc.ContextRefused):
            with contextlib.suppress(ValueError):
                self.metrics.validation_failure(Reason(answer.reason))
            return Fallback(FallbackCause.WORKER_REFUSED, Reason.PEER_REFUSED, answer.reason)
        if answer.length != len(prefix) or answer.digest != prefix.digest:
            self.metrics.validation_failure(Reason.CHECKSUM_MISMATCH)
            return Fallback(FallbackCause.INVALID_REPLY, Reason.CHECKSUM_MISMATCH, "context ack")
        return None
