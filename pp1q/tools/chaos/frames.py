"""Cutting a byte stream into wire v2 frames, and editing frames, for the fault proxy.

The header layout and checksums are pp1q.wire.framing's (``read_header``, ``reseal``;
docs/wire.md section 2). The proxy must forward anything,
including frames an earlier fault broke, so the cutter validates nothing but the two
declared lengths: a length above the wire's hard caps (or a bad magic) means the stream
can no longer be framed, and the rest of it is passed through as raw bytes. That keeps
"bounds before memory" true for the proxy too: it never buffers more than one frame of
at most HEADER + MAX_CONTROL + MAX_PAYLOAD_CAP bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from pp1q.wire import MAGIC, MsgType
from pp1q.wire.framing import HEADER_BYTES, read_header, reseal, set_payload_len
from pp1q.wire.limits import MAX_CONTROL_BYTES, MAX_PAYLOAD_CAP
from pp1q.wire.messages import CONTROL_CLASSES

_decoders = {t: msgspec.msgpack.Decoder(cls) for t, cls in CONTROL_CLASSES.items()}


@dataclass(frozen=True, slots=True)
class Piece:
    """One unit the proxy forwards: a whole frame, or raw bytes of an unframeable stream."""

    data: bytes
    mtype: int | None = None  # MsgType of a frame; None for raw bytes
    control_len: int = 0

    @property
    def is_frame(self) -> bool:
        return self.mtype is not None

    def message(self):
        """The decoded control part (REPLY, PROPOSAL: the head fields), or None if it
        does not decode."""
        if self.mtype not in _decoders:
            return None
        control = self.data[HEADER_BYTES: HEADER_BYTES + self.control_len]
        try:
            return _decoders[self.mtype].decode(control)
        except msgspec.MsgspecError:
            return None

    @property
    def payload(self) -> bytes:
        return self.data[HEADER_BYTES + self.control_len:]


class FrameCutter:
    """``feed(bytes) -> [Piece]``: whole frames while the stream frames, raw bytes after."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.raw = False  # the stream stopped framing (bad magic or an impossible length)

    def feed(self, data: bytes) -> list[Piece]:
        if self.raw:
            return [Piece(bytes(data))] if data else []
        self._buf += data
        out: list[Piece] = []
        while len(self._buf) >= HEADER_BYTES:
            h = read_header(self._buf)
            if (h.magic != MAGIC or h.control_len > MAX_CONTROL_BYTES
                    or h.payload_len > MAX_PAYLOAD_CAP):
                self.raw = True  # forward as is: the receiver must refuse it, not us
                out.append(Piece(bytes(self._buf)))
                self._buf.clear()
                return out
            n = h.frame_bytes
            if len(self._buf) < n:
                break
            out.append(Piece(bytes(self._buf[:n]), h.mtype, h.control_len))
            del self._buf[:n]
        return out


def flip_bit(piece: Piece, region: str, offset: int, bit: int = 0) -> bytes:
    """The frame with one bit flipped at ``offset`` of ``region`` (header, control,
    payload; the offset wraps within the region so any value hits it)."""
    start, end = {
        "header": (0, HEADER_BYTES),
        "control": (HEADER_BYTES, HEADER_BYTES + piece.control_len),
        "payload": (HEADER_BYTES + piece.control_len, len(piece.data)),
    }[region]
    if end <= start:
        raise ValueError(f"{MsgType(piece.mtype).name} frame has no {region} bytes")
    out = bytearray(piece.data)
    out[start + offset % (end - start)] ^= 1 << (bit % 8)
    return bytes(out)


def truncate_reframed(piece: Piece, keep: int) -> bytes:
    """The frame with its payload cut to ``keep`` bytes and the header made consistent
    again (payload_len and both checksums recomputed): a sender that writes a short row,
    which only the receiver's size checks can catch."""
    cut = HEADER_BYTES + piece.control_len + max(0, min(keep, len(piece.payload) - 1))
    out = bytearray(piece.data[:cut])
    set_payload_len(out, cut - HEADER_BYTES - piece.control_len)
    reseal(out)
    return bytes(out)
