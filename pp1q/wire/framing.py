"""Frames: fixed 32-byte header, msgpack control part, raw payload arrays.

    offset size  field
    0      4     magic            b"PP1Q"
    4      1     frame version    2
    5      1     message type     MsgType
    6      2     flags            0 (reserved; any other value is refused)
    8      4     control_len      1..MAX_CONTROL_BYTES
    12     4     payload_len      0, or at most the negotiated row (REPLY) / context
                                  (CONTEXT) bytes
    16     8     payload_xxh3     xxh3_64 of the payload bytes (REPLY: the probability checksum)
    24     8     head_xxh3        xxh3_64 of bytes 0..23 followed by the control part

All integers little-endian. Lengths are checked as soon as the header is complete,
before any buffer is allocated; the payload gets its own buffer, which decoded arrays
view without a further copy.

This module states each fact of the frame layout once, for every other reader of raw
frames (chaos proxy, capture tap, replay, fuzz harness, tests): ``HEADER`` (the struct),
``HEADER_BYTES``, the field offsets ``*_AT``, ``read_header`` (a ``Header`` tuple),
``head_checksum``/``reseal`` (the two checksums). Revision 2 carries everything (the
request context included) on one connection of these frames: there is nothing to sniff.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import msgspec
import numpy as np
import xxhash

from pp1q.core.errors import LocalProtocolError, Reason, RemoteProtocolError
from pp1q.wire.limits import (
    DEFAULT_LIMITS,
    MAX_CONTROL_BYTES,
    MAX_PAYLOAD_CAP,
    Limits,
)
from pp1q.wire.messages import (
    CONTEXT_HEAD_FIELDS,
    CONTROL_CLASSES,
    REPLY_HEAD_FIELDS,
    Context,
    Form,
    Message,
    MsgType,
    Reply,
    type_of,
)
from pp1q.wire.pool import PayloadPool
from pp1q.wire.sizes import context_sizes, payload_cap, reply_sizes

MAGIC = b"PP1Q"
FRAME_VERSION = 2

# -- the header layout, stated once ---------------------------------------------------
HEADER = struct.Struct("<4sBBHIIQQ")  # the 32-byte header, fields as in the table above
HEADER_BYTES = HEADER.size
MAGIC_AT, VERSION_AT, TYPE_AT, FLAGS_AT = 0, 4, 5, 6
CONTROL_LEN_AT, PAYLOAD_LEN_AT, PAYLOAD_SUM_AT, HEAD_SUM_AT = 8, 12, 16, 24
_HEAD = struct.Struct(HEADER.format[:-1])  # bytes 0..HEAD_SUM_AT: what head_xxh3 covers
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class Header(NamedTuple):
    """The 32 header bytes of one frame, as read (nothing checked)."""

    magic: bytes
    version: int
    mtype: int
    flags: int
    control_len: int
    payload_len: int
    payload_xxh3: int
    head_xxh3: int

    @property
    def frame_bytes(self) -> int:
        """The whole frame's size as this header declares it."""
        return HEADER_BYTES + self.control_len + self.payload_len


def read_header(buf, offset: int = 0) -> Header:
    """The header of the frame at ``offset`` of ``buf`` (at least HEADER_BYTES there)."""
    return Header._make(HEADER.unpack_from(buf, offset))


def head_checksum(head, control) -> int:
    """head_xxh3: xxh3_64 of header bytes 0..23 followed by the control part."""
    return _xxh3(bytes(head[:HEAD_SUM_AT]) + bytes(control))


def reseal(buf: bytearray, offset: int = 0) -> int:
    """Recompute both checksums of the frame at ``offset`` over the bytes that are there
    (declared lengths kept, cut short at the end of ``buf``); returns where it ends."""
    h = read_header(buf, offset)
    control_at = offset + HEADER_BYTES
    control_end = min(control_at + h.control_len, len(buf))
    payload_end = min(control_end + h.payload_len, len(buf))
    _U64.pack_into(buf, offset + PAYLOAD_SUM_AT, _xxh3(bytes(buf[control_end:payload_end])))
    _U64.pack_into(buf, offset + HEAD_SUM_AT,
                   head_checksum(buf[offset:offset + HEAD_SUM_AT], buf[control_at:control_end]))
    return payload_end


def set_payload_len(buf: bytearray, n: int, offset: int = 0) -> None:
    """Overwrite the payload_len field (callers reseal afterwards)."""
    _U32.pack_into(buf, offset + PAYLOAD_LEN_AT, n)


_SCRATCH_BYTES = 64 * 1024  # BufferedProtocol receive size outside a payload (asyncio's default)

_encoder = msgspec.msgpack.Encoder()
_decoders = {t: msgspec.msgpack.Decoder(cls) for t, cls in CONTROL_CLASSES.items()}
_xxh3 = xxhash.xxh3_64_intdigest


_HEAD_FIELDS = {MsgType.REPLY: REPLY_HEAD_FIELDS, MsgType.CONTEXT: CONTEXT_HEAD_FIELDS}
_TYPES = {int(t): t for t in MsgType}  # the header's type byte -> MsgType (no Enum call per frame)


def _control_bytes(msg) -> tuple[MsgType, bytes]:
    t = type_of(msg)
    n = _HEAD_FIELDS.get(t)
    return t, _checked_control(t, msg if n is None else msgspec.structs.astuple(msg)[:n])


def _checked_control(t: MsgType, fields) -> bytes:
    """The control part of a ``t`` frame from its fields in order (a struct or a tuple)."""
    try:  # our own message must satisfy the same schema the peer will enforce
        control = _encoder.encode(fields)
        _decoders[t].decode(control)
    except (msgspec.MsgspecError, OverflowError, TypeError) as e:
        raise LocalProtocolError(Reason.MALFORMED_CONTROL, f"{t.name}: {e}") from None
    if len(control) > MAX_CONTROL_BYTES:
        raise LocalProtocolError(Reason.FRAME_TOO_LARGE, f"control part {len(control)} bytes")
    return control


def _sealed_head(t: MsgType, control: bytes, payload_len: int, payload_sum: int) -> bytes:
    """The 32 header bytes: the fields, then head_xxh3 over them and the control part."""
    if payload_len > MAX_PAYLOAD_CAP:
        raise LocalProtocolError(Reason.FRAME_TOO_LARGE, f"payload {payload_len} bytes")
    head = _HEAD.pack(MAGIC, FRAME_VERSION, t, 0, len(control), payload_len, payload_sum)
    return head + _U64.pack(head_checksum(head, control))


def encode(msg: Message) -> bytes:
    """One complete frame (header, control and payload coalesced in one bytes object)."""
    return b"".join(encode_parts(msg))


def encode_parts(msg: Message) -> tuple:
    """One frame as (header + control bytes, *payload buffers), the payload not copied:
    for a vectored write (writelines), which must have sent a payload before its buffer
    is written again."""
    t, control = _control_bytes(msg)
    return _sealed_parts(t, control, msg.payload_parts() if t in _HEAD_FIELDS else ())


def encode_fields(t: MsgType, fields, payload: tuple = ()) -> tuple[bytes, int]:
    """One frame in one buffer from the control part's ``fields`` in order (a struct or
    a tuple) and ``payload``: C-contiguous LE arrays, in order; (frame, its payload
    checksum). Byte for byte ``encode`` of the same message, without building it (the
    worker's sparse REPLYs and COMPLETIONs: small frames, one join). The caller states
    the payload that matches the fields (a REPLY's ``entries``: its ids and q)."""
    control = _checked_control(t, fields)
    body = b"".join(payload)
    payload_sum = _xxh3(body)
    return (b"".join((_sealed_head(t, control, len(body), payload_sum), control, body)),
            payload_sum)


def _sealed_parts(t: MsgType, control: bytes, parts: tuple) -> tuple:
    h = xxhash.xxh3_64()
    for p in parts:
        h.update(p)
    head = _sealed_head(t, control, sum(len(p) for p in parts), h.intdigest())
    return (head + control, *parts)


def chain_checksum(payload_checksums) -> int:
    """COMPLETION.reply_checksum: xxh3_64 of the REPLY payload checksums, each as 8 LE
    bytes, in index order. Chaining covers every payload byte without hashing it twice."""
    return _xxh3(b"".join(_U64.pack(c) for c in payload_checksums))


def payload_checksum_of(frame: bytes) -> int:
    """The payload_xxh3 field of an encoded frame (what COMPLETION's checksum chains)."""
    return _U64.unpack_from(frame, PAYLOAD_SUM_AT)[0]


def _unraised(e: RemoteProtocolError) -> RemoteProtocolError:
    """A copy of ``e`` without its traceback, to keep (and raise again): a raised error's
    traceback holds our frames, and so ourselves, in a reference cycle."""
    return type(e)(e.reason, e.detail)


@dataclass(frozen=True, slots=True)
class Frame:
    """A decoded frame: the message, its total size, its payload checksum field, and
    ``error``: set (and the payload dropped) when header and control were intact but
    the payload is not (sizes inconsistent with the control part, checksum mismatch).
    Such a frame poisons only the proposal it belongs to, not the stream."""

    message: Message
    nbytes: int
    payload_checksum: int
    error: RemoteProtocolError | None = None


class FrameDecoder:
    """Incremental decoder: ``feed(data) -> [message, ...]``.

    Raises ``RemoteProtocolError`` (and nothing else) for malformed input; after that
    the stream is unusable and every later call raises the same error. ``limits`` may
    be replaced after HELLO (the endpoints tighten them to the negotiated values).
    Large payloads land in buffers recycled by ``pool`` once no decoded view of them
    is alive (see pool.py).
    For asyncio.BufferedProtocol: ``get_buffer()`` / ``buffer_updated(n)`` receive a
    payload directly into the frame's own buffer.
    """

    def __init__(self, limits: Limits = DEFAULT_LIMITS, pool: PayloadPool | None = None) -> None:
        self.limits = limits
        # message types the reader's state allows now (None: any); another type is refused
        # at its header, so a peer cannot make us buffer a frame we would refuse anyway
        self.accepts: frozenset[MsgType] | None = None
        # two generations of every in-flight row: the one being consumed, the next arriving
        self.pool = pool or PayloadPool(2 * limits.max_inflight * limits.max_depth
                                        * limits.max_payload)
        self._buf = bytearray()  # header + control of the frame being read
        self._head: tuple | None = None  # parsed header fields
        self._control = None  # decoded control struct
        self._payload: np.ndarray | None = None
        self._payload_mv: memoryview | None = None
        self._filled = 0
        self._skip = 0  # payload bytes to drop (frame already known corrupt)
        self._pending_error: RemoteProtocolError | None = None
        self._error: RemoteProtocolError | None = None
        self._scratch = memoryview(bytearray(_SCRATCH_BYTES))
        self._handed_payload = False

    # -- public -------------------------------------------------------------

    def feed(self, data) -> list[Message]:
        out = []
        for f in self.feed_frames(data):
            if f.error is not None:
                self._error = _unraised(f.error)
                raise f.error
            out.append(f.message)
        return out

    def feed_frames(self, data) -> list[Frame]:
        return list(self.iter_frames(data))

    def iter_frames(self, data) -> Iterator[Frame]:
        """Frames as they complete, so a consumer can validate each payload while it is
        still in cache. Consume it fully: unconsumed input stays unread."""
        if self._error is not None:
            raise _unraised(self._error)
        try:
            yield from self._frames(memoryview(data).cast("B"))
        except RemoteProtocolError as e:
            self._error = _unraised(e)
            raise

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held (0 at a frame boundary)."""
        return len(self._buf) + self._filled

    @property
    def at_boundary(self) -> bool:
        return self._head is None and not self._buf

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        if self._payload_mv is not None:
            self._handed_payload = True
            return self._payload_mv[self._filled:]
        self._handed_payload = False
        return self._scratch

    def buffer_updated(self, nbytes: int) -> list[Frame]:
        return list(self.iter_buffer_updated(nbytes))

    def iter_buffer_updated(self, nbytes: int) -> Iterator[Frame]:
        """``buffer_updated`` frame by frame: a consumer that changes ``accepts`` on a
        frame (a HELLO) has it applied to the next header of the same read."""
        if self._error is not None:
            raise _unraised(self._error)
        if not self._handed_payload:
            yield from self.iter_frames(self._scratch[:nbytes])
            return
        self._handed_payload = False
        self._filled += nbytes
        if self._filled < len(self._payload_mv):
            return
        try:
            yield self._finish_payload()
        except RemoteProtocolError as e:
            self._error = _unraised(e)
            raise

    # -- internals ----------------------------------------------------------

    def _frames(self, mv: memoryview) -> Iterator[Frame]:
        pos, end = 0, len(mv)
        while pos < end or self._frame_ready():
            if self._skip or self._payload_mv is not None:
                pos = self._take_payload(mv, pos, end)
                if self._payload_remaining():
                    break
                yield self._finish_payload()
                continue
            need = HEADER_BYTES if self._head is None else HEADER_BYTES + self._head[4]
            take = min(need - len(self._buf), end - pos)
            self._buf += mv[pos:pos + take]
            pos += take
            if len(self._buf) < need:
                break
            if self._head is None:
                self._parse_header()
                continue
            frame = self._parse_control()
            if frame is not None:
                yield frame

    def _frame_ready(self) -> bool:
        # a zero-length payload still has to be finished after its control part
        return (self._skip or self._payload_mv is not None) and not self._payload_remaining()

    def _payload_remaining(self) -> int:
        if self._payload_mv is not None:
            return len(self._payload_mv) - self._filled
        return self._skip - self._filled

    def _take_payload(self, mv: memoryview, pos: int, end: int) -> int:
        take = min(self._payload_remaining(), end - pos)
        if self._payload_mv is not None:
            self._payload_mv[self._filled:self._filled + take] = mv[pos:pos + take]
        self._filled += take
        return pos + take

    def _parse_header(self) -> None:
        magic, version, mtype, flags, control_len, payload_len, _ = _HEAD.unpack_from(self._buf)
        if magic != MAGIC:
            raise RemoteProtocolError(Reason.BAD_MAGIC, f"magic {bytes(magic)!r}")
        if version != FRAME_VERSION:
            raise RemoteProtocolError(Reason.BAD_VERSION, f"frame version {version}")
        if mtype not in _decoders:
            raise RemoteProtocolError(Reason.UNKNOWN_MESSAGE_TYPE, f"type {mtype}")
        mtype = _TYPES[mtype]
        if self.accepts is not None and mtype not in self.accepts:
            raise RemoteProtocolError(Reason.STATE_NOT_ALLOWED,
                                      f"{mtype.name} not allowed now")
        if flags:
            raise RemoteProtocolError(Reason.BAD_FLAGS, f"flags {flags:#06x}")
        if control_len == 0:  # every control part is a non-empty msgpack array
            raise RemoteProtocolError(Reason.MALFORMED_CONTROL, "empty control part")
        if control_len > MAX_CONTROL_BYTES:
            raise RemoteProtocolError(Reason.FRAME_TOO_LARGE, f"control_len {control_len}")
        cap = payload_cap(mtype, self.limits)
        if payload_len > cap:
            raise RemoteProtocolError(
                Reason.FRAME_TOO_LARGE, f"{mtype.name} payload_len {payload_len} > {cap}"
            )
        self._head = (magic, version, mtype, flags, control_len, payload_len)

    def _parse_control(self) -> Frame | None:
        _, _, mtype, _, control_len, payload_len = self._head
        buf = self._buf
        head_sum = _U64.unpack_from(buf, HEAD_SUM_AT)[0]
        if head_checksum(buf, buf[HEADER_BYTES:]) != head_sum:
            raise RemoteProtocolError(Reason.CHECKSUM_MISMATCH, "header/control checksum")
        try:
            control = _decoders[mtype].decode(buf[HEADER_BYTES:])
        except msgspec.MsgspecError as e:
            raise RemoteProtocolError(Reason.MALFORMED_CONTROL, f"{mtype.name}: {e}") from None
        self._control = control
        self._filled = 0
        if mtype is MsgType.REPLY:
            self._pending_error = reply_sizes(control, payload_len, self.limits)
        elif mtype is MsgType.CONTEXT:
            self._pending_error = context_sizes(control, payload_len, self.limits)
        if self._pending_error is not None or payload_len == 0:
            self._skip = payload_len  # nothing to keep: drop without allocating
            if payload_len == 0:
                return self._finish_payload()
            return None
        # bounds were checked at the header and against the control part: allocate now
        self._payload = self.pool.take(payload_len)
        self._payload_mv = memoryview(self._payload)
        return None

    def _finish_payload(self) -> Frame:
        _, _, mtype, _, control_len, payload_len = self._head
        declared = _U64.unpack_from(self._buf, PAYLOAD_SUM_AT)[0]
        control, payload, error = self._control, self._payload, self._pending_error
        nbytes = HEADER_BYTES + control_len + payload_len
        self._buf = bytearray()
        self._head = self._control = self._payload = self._payload_mv = None
        self._pending_error = None
        self._filled = self._skip = 0
        if error is None and _xxh3(payload if payload is not None else b"") != declared:
            error = RemoteProtocolError(Reason.CHECKSUM_MISMATCH, f"{mtype.name} payload")
        if mtype is MsgType.CONTEXT:
            tokens = None
            if error is None and payload is not None:
                payload.flags.writeable = False
                tokens = np.frombuffer(payload, dtype="<i4", count=control.count)
            return Frame(Context(**msgspec.structs.asdict(control), tokens=tokens), nbytes,
                         declared, error)
        if mtype is not MsgType.REPLY:
            return Frame(control, nbytes, declared, error)
        ids = q = None
        if error is None and payload is not None:
            payload.flags.writeable = False
            n = control.entries
            if control.form == Form.SPARSE:
                ids = np.frombuffer(payload, dtype="<i4", count=n)
                q = np.frombuffer(payload, dtype="<f4", count=n, offset=4 * n)
            else:
                q = np.frombuffer(payload, dtype="<f4", count=n)
        # positional: the head's fields in order, then the payload views (Reply's layout)
        return Frame(Reply(*msgspec.structs.astuple(control), ids, q), nbytes, declared, error)

