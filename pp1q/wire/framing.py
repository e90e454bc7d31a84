"""Frames: fixed 32-byte header, msgpack control part, raw payload arrays.

    offset size  field
    0      4     magic            b"PP1Q"
    4      1     frame version    2
    5      1     message type     MsgType
    6      2     flags            0 (reserved; any other value is refused)
    8      4     control_len      1..MAX_CONTROL_BYTES
    12     4     payload_len      0, or at most the negotiated row (REPLY, PROPOSAL) /
                                  context (CONTEXT) bytes
    16     8     payload_xxh3     xxh3_64 of the payload bytes (REPLY: the probability
                                  checksum; PROPOSAL: of its whole payload, standing in
                                  for a COMPLETION's checksum)
    24     8     head_xxh3        xxh3_64 of bytes 0..23 followed by the control part

All integers little-endian. The receiver (pp1q.wire.decoder) checks lengths as soon as
the header is complete, before any buffer is allocated; the payload gets its own
buffer, which decoded arrays view without a further copy.

This module states each fact of the frame layout once, for every other reader of raw
frames (chaos proxy, capture tap, replay, fuzz harness, tests): ``HEADER`` (the struct),
``HEADER_BYTES``, the field offsets ``*_AT``, ``read_header`` (a ``Header`` tuple),
``head_checksum``/``reseal`` (the two checksums). Since revision 2 everything (the
request context included) travels on one connection of these frames: nothing to sniff.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import msgspec
import xxhash

from pp1q.core.errors import LocalProtocolError, Reason, RemoteProtocolError
from pp1q.wire.limits import MAX_CONTROL_BYTES, MAX_PAYLOAD_CAP
from pp1q.wire.messages import (
    CONTEXT_HEAD_FIELDS,
    CONTROL_CLASSES,
    PROPOSAL_HEAD_FIELDS,
    REPLY_HEAD_FIELDS,
    Message,
    MsgType,
    type_of,
)

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
    """head_xxh3: xxh3_64 of header bytes 0..23 followed by the control part (streamed:
    the two pieces are not copied into one)."""
    h = xxhash.xxh3_64(head[:HEAD_SUM_AT])
    h.update(control)
    return h.intdigest()


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


_encoder = msgspec.msgpack.Encoder()
_decoders = {t: msgspec.msgpack.Decoder(cls) for t, cls in CONTROL_CLASSES.items()}
_xxh3 = xxhash.xxh3_64_intdigest


_HEAD_FIELDS = {MsgType.REPLY: REPLY_HEAD_FIELDS, MsgType.CONTEXT: CONTEXT_HEAD_FIELDS,
                MsgType.PROPOSAL: PROPOSAL_HEAD_FIELDS}


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


def encode_fields_parts(t: MsgType, fields, payload: tuple) -> tuple[tuple, int]:
    """``encode_fields`` without joining: ((header + control, *payload), its payload
    checksum), ``payload`` byte buffers (memoryviews cast to "B") not copied: the
    worker's dense REPLYs, 517 KB rows written by a vectored write."""
    return _sealed(t, _checked_control(t, fields), payload)


def _sealed_parts(t: MsgType, control: bytes, parts: tuple) -> tuple:
    return _sealed(t, control, parts)[0]


def _sealed(t: MsgType, control: bytes, parts: tuple) -> tuple[tuple, int]:
    h = xxhash.xxh3_64()
    for p in parts:
        h.update(p)
    payload_sum = h.intdigest()
    head = _sealed_head(t, control, sum(len(p) for p in parts), payload_sum)
    return (head + control, *parts), payload_sum


def chain_checksum(payload_checksums) -> int:
    """COMPLETION.reply_checksum: xxh3_64 of the REPLY payload checksums, each as 8 LE
    bytes, in index order. Chaining covers every payload byte without hashing it twice."""
    return _xxh3(b"".join(_U64.pack(c) for c in payload_checksums))


def payload_checksum_of(frame: bytes) -> int:
    """The payload_xxh3 field of an encoded frame (what COMPLETION's checksum chains)."""
    return _U64.unpack_from(frame, PAYLOAD_SUM_AT)[0]


class Frame(NamedTuple):
    """A decoded frame: the message, its total size, its payload checksum field, and
    ``error``: set (and the payload dropped) when header and control were intact but
    the payload is not (sizes inconsistent with the control part, checksum mismatch).
    Such a frame poisons only the proposal it belongs to, not the stream.
    A tuple: one is built per frame, and a frozen dataclass costs twice as much."""

    message: Message
    nbytes: int
    payload_checksum: int
    error: RemoteProtocolError | None = None
    # a dense REPLY's q passed q_backend.copy_scanned's checks as it was copied in (the
    # checksum is still the decoder's to verify, the padding the validator's)
    q_checked: bool = False
    # a PROPOSAL's whole payload as int32 words, which its rows' ids and q view (checked
    # in one kernel call, pp1q.core.q_parse.parse_sparse_rows); None for other frames
    words: object = None
