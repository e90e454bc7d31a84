"""Capture records -> decoded messages, per connection and direction, in record order.

Each direction of each connection has its own wire v2 ``FrameDecoder``, fed the DATA
bodies in order, so frames split
across records or packed several to a record decode the same. A stream that breaks
(``RemoteProtocolError``) yields one ``error`` item and is ignored from then on. A
decoder (64 KiB of buffers) is made at its stream's first DATA and let go at CLOSE, so
what a capture makes this hold is bounded by the connections open at once (the reader's
MAX_OPEN_CONNECTIONS), not by how many it opens.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from pp1q.core.errors import RemoteProtocolError
from pp1q.runtime.capture import Direction, Kind, Protocol, Record, Role
from pp1q.wire import DEFAULT_LIMITS, Frame, FrameDecoder, Hello, HelloAnswer


class Flow(enum.StrEnum):
    """Direction relative to the protocol, not to the recording process."""

    TO_WORKER = "V>W"
    TO_VERIFIER = "W>V"


def flow_of(role: Role, direction: Direction) -> Flow:
    sent_by_verifier = (role is Role.VERIFIER) == (direction is Direction.OUT)
    return Flow.TO_WORKER if sent_by_verifier else Flow.TO_VERIFIER


@dataclass(frozen=True, slots=True)
class Item:
    """One line of the analysis: a connection event, a message, or a stream error.

    ``what``: "open", "close", "info", "frame" (wire), "error", "bytes"
    (a stream of an unknown protocol, or bytes after its error). ``raw`` is the frame's
    exact bytes for wire frames toward the worker (control frames and CONTEXT payloads).
    """

    time_ns: int
    conn: int
    flow: Flow | None
    what: str
    message: object = None
    frame: Frame | None = None
    raw: bytes | None = None
    error: RemoteProtocolError | None = None
    meta: dict = field(default_factory=dict)
    nbytes: int = 0


class _Stream:
    """One direction of one connection."""

    def __init__(self, protocol: str, flow: Flow) -> None:
        self.protocol, self.flow = protocol, flow
        self.broken = False
        self.keep_raw = protocol == Protocol.WIRE and flow is Flow.TO_WORKER
        self._pending = bytearray()  # undecoded raw bytes (kept only when keep_raw)
        self.limits = DEFAULT_LIMITS  # the session's, once its HELLO is seen
        self._wire: FrameDecoder | None = None  # made at the first DATA

    @property
    def wire(self) -> FrameDecoder:
        if self._wire is None:
            self._wire = FrameDecoder(self.limits)
        return self._wire

    def tighten(self, limits) -> None:
        self.limits = limits
        if self._wire is not None:
            self._wire.limits = limits

    def feed(self, rec: Record, conn: int) -> list[Item]:
        if self.broken or self.protocol != Protocol.WIRE:
            return [Item(rec.time_ns, conn, self.flow, "bytes", nbytes=len(rec.body))]
        out: list[Item] = []
        try:
            self._feed_wire(rec, conn, out)
        except RemoteProtocolError as e:  # the frames before it in the record stand: the
            self.broken = True  # same items whatever the record boundaries
            out.append(Item(rec.time_ns, conn, self.flow, "error", error=e))
        return out

    def _feed_wire(self, rec: Record, conn: int, out: list[Item]) -> None:
        if self.keep_raw:
            self._pending += rec.body
        for frame in self.wire.iter_frames(rec.body):
            raw = None
            if self.keep_raw:
                raw = bytes(self._pending[:frame.nbytes])
                del self._pending[:frame.nbytes]
            out.append(Item(rec.time_ns, conn, self.flow, "frame", message=frame.message,
                            frame=frame, raw=raw, nbytes=frame.nbytes))


class StreamSet:
    """Decoders of every connection of one capture."""

    def __init__(self, role: Role) -> None:
        self.role = role
        self.protocols: dict[int, str] = {}
        self._streams: dict[tuple[int, Flow], _Stream] = {}

    def items(self, rec: Record) -> list[Item]:
        if rec.kind is Kind.INFO:
            return [Item(rec.time_ns, 0, None, "info", meta=rec.meta)]
        if rec.kind is Kind.OPEN:
            proto = str(rec.meta.get("protocol", ""))
            self.protocols[rec.conn] = proto
            for flow in Flow:
                self._streams[(rec.conn, flow)] = _Stream(proto, flow)
            return [Item(rec.time_ns, rec.conn, None, "open", meta=rec.meta)]
        if rec.kind is Kind.CLOSE:  # nothing follows on it (the reader checks): let go
            for flow in Flow:
                del self._streams[(rec.conn, flow)]
            self.protocols.pop(rec.conn, None)
            return [Item(rec.time_ns, rec.conn, None, "close", meta=rec.meta)]
        flow = flow_of(self.role, rec.direction)
        items = self._streams[(rec.conn, flow)].feed(rec, rec.conn)
        for it in items:
            self._tighten(rec.conn, it.message)
        return items

    def _tighten(self, conn: int, msg) -> None:
        # payload bounds (REPLY, PROPOSAL, CONTEXT) come from the session's limits, as on the
        # endpoints: the HELLO's offer, then the answer's negotiated minimum
        if isinstance(msg, (Hello, HelloAnswer)) and msg.limits.max_context:
            for flow in Flow:
                self._streams[(conn, flow)].tighten(msg.limits)


def decode(role: Role, records: Iterable[Record]) -> Iterator[Item]:
    streams = StreamSet(role)
    for rec in records:
        yield from streams.items(rec)
