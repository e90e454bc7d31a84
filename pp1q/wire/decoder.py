"""FrameDecoder: received bytes in, decoded frames out (the layout is pp1q.wire.framing's).

Bounds before memory: a header is checked as soon as it is complete, before anything
it declares is buffered; a control part before its payload gets a buffer. A frame
whose header and control lie whole in the bytes fed is read where it lies; only a
frame split across reads is staged. Large payloads land in buffers recycled by a
``PayloadPool`` (pool.py); a dense REPLY copied out whole has its q checked on the
way (``q_backend.copy_scanned``, ``Frame.q_checked``).
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import numpy as np

from pp1q.core import q_backend
from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.wire.framing import (  # the layout's own structs and control decoders
    _HEAD,
    _U64,
    FRAME_VERSION,
    HEAD_SUM_AT,
    HEADER_BYTES,
    MAGIC,
    PAYLOAD_SUM_AT,
    Frame,
    _decoders,
    _xxh3,
    head_checksum,
)
from pp1q.wire.limits import DEFAULT_LIMITS, MAX_CONTROL_BYTES, Limits
from pp1q.wire.messages import Context, Form, Message, MsgType, Proposal, Reply
from pp1q.wire.pool import POOL_MIN_BYTES, PayloadPool
from pp1q.wire.proposal import row_views
from pp1q.wire.sizes import context_sizes, payload_cap, proposal_sizes, reply_sizes

_SCRATCH_BYTES = 64 * 1024  # BufferedProtocol receive size outside a payload (asyncio's default)
_TYPES = {int(t): t for t in MsgType}  # the header's type byte -> MsgType (no Enum call per frame)
_I4, _F4 = np.dtype("<i4"), np.dtype("<f4")  # a REPLY's ids and q (parsed once, not per frame)
# enum members as plain names (Python 3.11 takes ~0.1 us to look one up; these run per frame)
_REPLY, _CONTEXT, _SPARSE, _DENSE = MsgType.REPLY, MsgType.CONTEXT, Form.SPARSE, Form.DENSE
_PROPOSAL = MsgType.PROPOSAL


def _unraised(e: RemoteProtocolError) -> RemoteProtocolError:
    """A copy of ``e`` without its traceback, to keep (and raise again): a raised error's
    traceback holds our frames, and so ourselves, in a reference cycle."""
    return type(e)(e.reason, e.detail)


class FrameDecoder:
    """Incremental decoder: ``feed(data) -> [message, ...]``.

    Raises ``RemoteProtocolError`` (and nothing else) for malformed input; after that
    the stream is unusable and every later call raises the same error. ``limits`` may
    be replaced after HELLO (the endpoints tighten them to the negotiated values).
    Large payloads land in buffers recycled by ``pool`` once no decoded view of them
    is alive (see pool.py).
    For asyncio.BufferedProtocol: ``get_buffer()`` / ``buffer_updated(n)`` receive a
    payload directly into the frame's own buffer.

    A frame whose header and control part lie whole in the bytes fed is read where it
    lies (no staging copy); only a frame split across reads is staged in ``_buf``.
    Both ways run the same checks (``_check_header``, ``_open``) in the same order.
    """

    def __init__(self, limits: Limits = DEFAULT_LIMITS, pool: PayloadPool | None = None) -> None:
        self.limits = limits
        # message types the reader's state allows now (None: any); another type is refused
        # at its header, so a peer cannot make us buffer a frame we would refuse anyway
        self.accepts: frozenset[MsgType] | None = None
        # two generations of every in-flight row: the one being consumed, the next arriving
        self.pool = pool or PayloadPool(2 * limits.max_inflight * limits.max_depth
                                        * limits.max_payload)
        self._buf = bytearray()  # staged header (+ control) of a frame split across reads
        self._head: tuple | None = None  # (mtype, control_len, payload_len) of a staged header
        # the frame whose header and control were read and checked, its payload arriving:
        # (type, control struct, payload_xxh3 field, frame bytes, error: the sizes were
        # refused and the payload is skipped unread). A plain tuple: one per frame.
        self._frame: tuple | None = None
        self._payload: np.ndarray | None = None
        self._payload_mv: memoryview | None = None
        self._filled = 0
        self._skip = 0  # payload bytes to drop (frame already known corrupt)
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
        return self._frame is None and not self._buf

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
        while True:
            if self._frame is not None:  # a payload (possibly empty) is arriving
                pos = self._take_payload(mv, pos, end)
                if self._payload_remaining():
                    return
                yield self._finish_payload()
                continue
            if not self._buf and end - pos >= HEADER_BYTES:  # at a boundary, header here
                mtype, control_len, payload_len = self._check_header(mv, pos)
                need = HEADER_BYTES + control_len
                if end - pos < need:  # the control part continues in a later read
                    self._head = (mtype, control_len, payload_len)
                    self._buf += mv[pos:end]
                    return
                src, at = mv, pos
                pos += need
            else:  # staging a header or control part split across reads
                need = HEADER_BYTES if self._head is None else HEADER_BYTES + self._head[1]
                take = min(need - len(self._buf), end - pos)
                self._buf += mv[pos:pos + take]
                pos += take
                if len(self._buf) < need:
                    return
                if self._head is None:
                    self._head = self._check_header(self._buf, 0)
                    continue
                mtype, control_len, payload_len = self._head
                src, at = memoryview(bytes(self._buf)), 0
                self._buf = bytearray()
                self._head = None
            if not self._open(mtype, control_len, payload_len, src, at):
                continue  # no payload to keep: finished (or skipped) above
            if end - pos >= payload_len:  # the payload is whole here: copied out at once
                yield self._finish_payload(*self._copy_out(mv[pos:pos + payload_len]))
                pos += payload_len
                continue
            # bounds were checked at the header and against the control part: allocate now
            self._payload = self.pool.take(payload_len)
            self._payload_mv = memoryview(self._payload)

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

    def _check_header(self, buf, at: int) -> tuple[MsgType, int, int]:
        """(type, control_len, payload_len) of the header at ``buf[at:]``, every field
        checked before anything it declares is buffered."""
        magic, version, mtype, flags, control_len, payload_len, _ = _HEAD.unpack_from(buf, at)
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
        return mtype, control_len, payload_len

    def _open(self, mtype: MsgType, control_len: int, payload_len: int, src, at: int) -> bool:
        """Check and decode the control part of the frame at ``src[at:]`` (its header
        checked, header and control there whole). True: its payload is to be kept."""
        control_at = at + HEADER_BYTES
        control_mv = src[control_at:control_at + control_len]
        if head_checksum(src[at:at + HEAD_SUM_AT], control_mv) != _U64.unpack_from(
                src, at + HEAD_SUM_AT)[0]:
            raise RemoteProtocolError(Reason.CHECKSUM_MISMATCH, "header/control checksum")
        try:
            control = _decoders[mtype].decode(control_mv)
        except msgspec.MsgspecError as e:
            raise RemoteProtocolError(Reason.MALFORMED_CONTROL, f"{mtype.name}: {e}") from None
        error = None
        if mtype is _REPLY:
            error = reply_sizes(control, payload_len, self.limits)
        elif mtype is _PROPOSAL:
            error = proposal_sizes(control, payload_len, self.limits)
        elif mtype is _CONTEXT:
            error = context_sizes(control, payload_len, self.limits)
        self._frame = (mtype, control, _U64.unpack_from(src, at + PAYLOAD_SUM_AT)[0],
                       HEADER_BYTES + control_len + payload_len, error)
        self._filled = 0
        if error is not None or payload_len == 0:
            self._skip = payload_len  # nothing to keep: drop without allocating
            return False
        return True

    def _copy_out(self, whole: memoryview) -> tuple:
        """(payload, q_checked): a payload that lies whole in the bytes fed, copied once
        into its own buffer (the caller may reuse what it fed): a small one into bytes,
        which are read-only already and cost less than an array; a large one into a
        pooled buffer, a dense REPLY's q checked on the way (one pass over the row
        instead of a copy and a later scan)."""
        n = len(whole)
        if n < POOL_MIN_BYTES:
            return bytes(whole), False
        buf = self.pool.take(n)
        mtype, control = self._frame[:2]
        if mtype is _REPLY and control.form == _DENSE:
            return buf, q_backend.copy_scanned(buf, whole)
        buf[:] = whole
        return buf, False

    def _finish_payload(self, payload=None, q_checked: bool = False) -> Frame:
        """The frame whose payload is complete (``payload``: copied out whole, else in
        the buffer it was received into)."""
        mtype, control, declared, nbytes, error = self._frame
        if payload is None:
            payload = self._payload
        self._frame = self._payload = self._payload_mv = None
        self._filled = self._skip = 0
        if error is None and _xxh3(payload if payload is not None else b"") != declared:
            error = RemoteProtocolError(Reason.CHECKSUM_MISMATCH, f"{mtype.name} payload")
        if mtype is _CONTEXT:
            tokens = None
            if error is None and payload is not None:
                _freeze(payload)
                tokens = np.frombuffer(payload, dtype="<i4", count=control.count)
            return Frame(Context(**msgspec.structs.asdict(control), tokens=tokens), nbytes,
                         declared, error)
        if mtype is _PROPOSAL:
            words = None
            if error is None and payload is not None:
                _freeze(payload)
                words = np.frombuffer(payload, dtype=_I4)  # one frombuffer; rows slice it
            return Frame(_proposal(control, words), nbytes, declared, error, False, words)
        if mtype is not _REPLY:
            return Frame(control, nbytes, declared, error)
        ids = q = None
        if error is None and payload is not None:
            _freeze(payload)
            n = control.entries
            if control.form == _SPARSE:  # one frombuffer, two slices: cheaper than two
                words = np.frombuffer(payload, dtype=_I4)
                ids, q = words[:n], words[n:].view(_F4)
            else:
                q = np.frombuffer(payload, dtype=_F4, count=n)
        # positional: the head's fields in order, then the payload views (Reply's layout)
        return Frame(Reply(*msgspec.structs.astuple(control), ids, q), nbytes, declared, error,
                     q_checked and error is None)


def _proposal(head, words) -> Proposal:
    """The decoded PROPOSAL: each position's ids and q viewed in ``words`` (None: the
    frame failed, no rows)."""
    ids = q = None
    if words is not None:
        ids, q = row_views(words, head.entries)
    return Proposal(*msgspec.structs.astuple(head), ids, q)


def _freeze(payload) -> None:
    """Views of a handed-out payload are read-only (bytes are already)."""
    if type(payload) is np.ndarray:
        payload.flags.writeable = False
