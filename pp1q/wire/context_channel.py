"""The context channel: how the worker learns a request's committed prefix.

Wire v2 (pp1q.wire) carries only a digest of the committed prefix in each STEP; it
assumes the drafter already holds the prefix state. The daemons therefore open a second,
small TCP connection to the same worker port for the prefix itself:

    client preamble  PREAMBLE (8 bytes, sent once)
    frame            u32 LE length n (checked against MAX_FRAME_BYTES first), n bytes of
                     msgpack: a tagged ``SetContext`` / ``ContextAck`` / ``ContextRefused``

``SetContext(session, slot, generation, tokens, digest)`` states the full committed
prefix of ``slot`` under ``generation`` of wire session ``session``; the worker answers
with ``ContextAck`` (after which STEPs of that generation may be sent) or
``ContextRefused``. The digest is ``pp1q.core.prefix`` over ``tokens`` and is checked on
arrival; every later STEP's ``prefix_digest`` is checked against the worker's copy.
Sans-IO: ``encode`` makes bytes, ``ContextDecoder.feed`` turns bytes into messages and
raises ``RemoteProtocolError`` for anything malformed.
"""

from __future__ import annotations

import struct
from typing import Annotated

import msgspec

from pp1q.core.errors import Reason, RemoteProtocolError

PREAMBLE = b"PP1CTX01"  # first bytes of a context connection; wire v2 frames start b"PP1Q"
MAX_CONTEXT_TOKENS = 1 << 17  # a prompt (<= 65536) plus the longest generation, with room
MAX_FRAME_BYTES = 64 + 5 * MAX_CONTEXT_TOKENS  # msgpack int32 <= 5 bytes each, plus fields
_LEN = struct.Struct("<I")

_U64 = Annotated[int, msgspec.Meta(ge=0)]  # msgspec checks the uint64 range itself
_U32 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFFFFFF)]
_Id = Annotated[int, msgspec.Meta(ge=0, le=(1 << 31) - 1)]


class _Msg(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True,
           tag_field="t"):
    pass


class SetContext(_Msg, tag=1):
    session: _U64
    slot: _U32
    generation: _U32
    tokens: Annotated[list[_Id], msgspec.Meta(max_length=MAX_CONTEXT_TOKENS)]
    digest: _U64


class ContextAck(_Msg, tag=2):
    session: _U64
    slot: _U32
    generation: _U32
    length: _U32
    digest: _U64


class ContextRefused(_Msg, tag=3):
    session: _U64
    slot: _U32
    generation: _U32
    reason: Annotated[str, msgspec.Meta(max_length=64)]


ContextMessage = SetContext | ContextAck | ContextRefused
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ContextMessage)


def encode(msg: ContextMessage) -> bytes:
    body = _encoder.encode(msg)
    return _LEN.pack(len(body)) + body


class ContextDecoder:
    """Incremental decoder; ``expect_preamble`` on the worker's side of a connection."""

    def __init__(self, expect_preamble: bool = False) -> None:
        self._buf = bytearray()
        self._need_preamble = expect_preamble

    def feed(self, data: bytes) -> list[ContextMessage]:
        self._buf += data
        out: list[ContextMessage] = []
        if self._need_preamble:
            if len(self._buf) < len(PREAMBLE):
                return out
            if bytes(self._buf[: len(PREAMBLE)]) != PREAMBLE:
                raise RemoteProtocolError(Reason.BAD_MAGIC, "context channel preamble")
            del self._buf[: len(PREAMBLE)]
            self._need_preamble = False
        while len(self._buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(self._buf)
            if n > MAX_FRAME_BYTES:  # before buffering a byte of the body
                raise RemoteProtocolError(Reason.FRAME_TOO_LARGE, f"context frame of {n} bytes")
            if len(self._buf) < _LEN.size + n:
                break
            body = bytes(self._buf[_LEN.size: _LEN.size + n])
            del self._buf[: _LEN.size + n]
            try:
                out.append(_decoder.decode(body))
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                raise RemoteProtocolError(Reason.MALFORMED_CONTROL, str(e)[:200]) from None
        return out
