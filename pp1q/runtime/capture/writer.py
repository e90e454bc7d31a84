"""CaptureWriter: records every byte a daemon sends and receives, cheaply.

One writer per daemon process, used from its event loop thread only (no locking).
Per frame the cost is one struct pack, one xxh3 pass over the bytes (GB/s) and a
buffered write; nothing is decoded. Under a running event loop the buffer is flushed at
the end of every loop tick that recorded anything (one write(2) per tick, a round takes
several), so ``pp1q replay --follow`` reads a capture while its daemon runs. A capture
that cannot be written (disk full, size cap reached) stops recording and says so once
in the log, and the file stays valid up to its last whole record: serving never fails
because of a capture.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import time
from pathlib import Path

from pp1q.runtime.capture.format import (
    MAX_CONN_ID,
    MAX_DATA_BYTES,
    MAX_META_BYTES,
    MAX_PROTOCOL_CHARS,
    RECORD_HEADER_BYTES,
    Direction,
    Kind,
    Protocol,
    Role,
    file_header,
    meta_body,
    record_head,
)
from pp1q.runtime.files import open_output

log = logging.getLogger("pp1q.runtime.capture")

WRITE_BUFFER_BYTES = 1 << 20  # coalesce small frames into few write(2) calls
LARGE_BODY_BYTES = 64 * 1024  # a body this large skips the buffer: one copy fewer (dense rows)
MAX_DETAIL_CHARS = 256  # CLOSE reasons and OPEN peers: a diagnostic, bounded like wire details


def _time_ns(now: float | None) -> int:
    """``now`` in seconds of the monotonic clock (the endpoints' clock), or None: read it."""
    return time.monotonic_ns() if now is None else round(now * 1e9)


class CaptureWriter:
    """Append-only writer of a capture file (format in pp1q/runtime/capture/format.py).

    ``max_bytes`` caps the file size: at the cap an INFO record ``{"stopped":
    "max_bytes"}`` is written and recording stops. ``wall_ns`` (the header's start time)
    exists for byte-reproducible captures (tests/support/capture_vectors.py).
    """

    def __init__(self, path: str | os.PathLike, *, role: Role, info: dict | None = None,
                 max_bytes: int | None = None, wall_ns: int | None = None) -> None:
        self.path = Path(path)
        self.role = Role(role)
        self.max_bytes = max_bytes
        self.failed: Exception | None = None  # set once recording stopped on an error
        self.stopped = False  # no more records (error, size cap or close)
        self._next_conn = 1
        self._open: set[int] = set()
        self._flush_scheduled = False
        # a FIFO, device or folder is refused by name (open() blocked on a FIFO for ever)
        raw = open_output(self.path, buffering=0)
        self._fd = raw.fileno()
        self._file = io.BufferedWriter(raw, WRITE_BUFFER_BYTES)
        start = time.time_ns() if wall_ns is None else wall_ns
        self._written = 0
        self._put(file_header(self.role, start), b"")
        if info:
            self.info(info)

    @classmethod
    def open(cls, path: str | os.PathLike, role: Role | str, info: dict | None = None,
             max_bytes: int | None = None) -> CaptureWriter:
        """The daemons' one call: ``role`` is a Role or "verifier"/"worker"."""
        if isinstance(role, str):
            role = Role[role.upper()]
        return cls(path, role=role, info=info, max_bytes=max_bytes)

    # -- recording -----------------------------------------------------------

    def open_conn(self, protocol: Protocol | str = Protocol.WIRE, peer: str = "",
                  now: float | None = None) -> int:
        """A new connection id (u32, from 1); records OPEN with the protocol and peer."""
        proto = str(protocol)
        if not proto or len(proto) > MAX_PROTOCOL_CHARS:
            raise ValueError(f"protocol name {proto!r}")
        conn = self._next_conn
        if conn > MAX_CONN_ID:
            raise ValueError("connection ids exhausted")
        self._next_conn += 1
        self._open.add(conn)
        body = meta_body({"protocol": proto, "peer": str(peer)[:MAX_DETAIL_CHARS]})
        self._record(Kind.OPEN, Direction.NONE, conn, _time_ns(now), body)
        return conn

    def record(self, direction: Direction | str, conn_id: int, now: float | None,
               data) -> None:
        """Bytes of one direction of ``conn_id``'s stream (whole encoded frames ideally).

        ``direction``: Direction.IN/OUT or "in"/"out"; ``now``: monotonic seconds, or
        None to read the clock here (nanosecond resolution; uvloop's loop.time() is ms).
        """
        if self.stopped:
            return
        d = Direction[direction.upper()] if isinstance(direction, str) else Direction(direction)
        if d is Direction.NONE:
            raise ValueError("DATA needs direction in or out")
        if conn_id not in self._open:
            raise ValueError(f"connection {conn_id} is not open in this capture")
        t = _time_ns(now)
        mv = memoryview(data).cast("B")
        for start in range(0, len(mv), MAX_DATA_BYTES):  # one record never exceeds the cap
            self._record(Kind.DATA, d, conn_id, t, mv[start:start + MAX_DATA_BYTES])

    def close_conn(self, conn_id: int, reason: str = "", now: float | None = None) -> None:
        if conn_id not in self._open:
            return  # closing twice (connection_lost after a local close) is harmless
        self._open.discard(conn_id)
        body = meta_body({"reason": str(reason)[:MAX_DETAIL_CHARS]})
        self._record(Kind.CLOSE, Direction.NONE, conn_id, _time_ns(now), body)

    def info(self, fields: dict, now: float | None = None) -> None:
        """Facts for the reader (settings such as ``step_timeout_s``): a JSON object."""
        body = meta_body(dict(fields))
        if len(body) > MAX_META_BYTES:
            raise ValueError(f"INFO body {len(body)} bytes > {MAX_META_BYTES}")
        self._record(Kind.INFO, Direction.NONE, 0, _time_ns(now), body)

    def flush(self) -> None:
        if not self.stopped and not self._file.closed:
            self._guard(self._file.flush)

    def close(self) -> None:
        """Flush and close; every connection still open is closed as "capture_closed"."""
        for conn in sorted(self._open):
            self.close_conn(conn, "capture_closed")
        self.stopped = True
        try:
            self._file.close()
        except OSError as e:
            self._fail(e)

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def bytes_written(self) -> int:
        return self._written

    # -- internals -------------------------------------------------------------

    def _record(self, kind: Kind, d: Direction, conn: int, t: int, body) -> None:
        if self.stopped:
            return
        size = RECORD_HEADER_BYTES + len(body)
        if self.max_bytes is not None and self._written + size > self.max_bytes:
            stop = meta_body({"stopped": "max_bytes"})
            self._put(record_head(Kind.INFO, Direction.NONE, 0, t, stop), stop)
            log.warning("capture %s reached %d bytes; recording stopped", self.path,
                        self.max_bytes)
            self.stopped = True
            self._guard(self._file.flush)
            return
        self._put(record_head(kind, d, conn, t, body), body)

    def _put(self, head: bytes, body) -> None:
        def write() -> None:
            if len(body) >= LARGE_BODY_BYTES:
                self._file.flush()  # keep the order, then one writev without a copy
                _write_all(self._fd, [head, body])
                return
            self._file.write(head)
            if len(body):
                self._file.write(body)
        if self._guard(write):
            self._written += len(head) + len(body)
            self._flush_soon()

    def _flush_soon(self) -> None:
        """Flush once this event-loop tick is over (no loop: the buffer fills, as a file)."""
        if self._flush_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._flush_scheduled = True

        def flush() -> None:
            self._flush_scheduled = False
            self.flush()
        loop.call_soon(flush)

    def _guard(self, fn) -> bool:
        try:
            fn()
            return True
        except OSError as e:
            self._fail(e)
            return False

    def _fail(self, e: OSError) -> None:
        if self.failed is None:
            log.error("capture %s failed (%s); recording stopped", self.path, e)
        self.failed = e
        self.stopped = True


def _write_all(fd: int, parts) -> None:
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views:
            views[0] = views[0][n:]


def write_records(path: str | os.PathLike, header, records) -> None:
    """Write ``records`` (``Record``s, e.g. read, edited, split) verbatim under ``header``:
    for trimming or editing captures, and for building malformed ones in tests."""
    with open_output(path) as f:
        f.write(file_header(header.role, header.start_unix_ns))
        for r in records:
            f.write(record_head(r.kind, r.direction, r.conn, r.time_ns, r.body))
            f.write(r.body)
