"""A live replay without a socket: pp1q.tools.replay.live_core's commands done against
a simulated live worker.

``replay(role, records, live=...)`` runs the replay's sans-IO core (``LiveReplay``, the
same the asyncio adapter pp1q.tools.replay.live drives) and plays each connection's
live worker from the bytes it sends (``live``: by default none; ``self_replay`` gives it
the captured worker's own). Only the worker is simulated here: it sends its bytes in
order as soon as it may, a frame once the replay has sent what it answers (the HELLO,
its STEP), bytes that do not frame when they come. Reads are a frame each (``piece``
None; bytes that do not frame go in one read) or ``piece`` bytes. A connection in
``closes`` is closed by its worker once its bytes are all sent. A ``Wait`` ends once
the worker sent all it may: what it still owes then, it would never send (the adapter's
deadline passing). The line the adapter would raise ``LiveError`` with (exit status 3)
comes back as ``Result.fatal``.

``capture_edits.rechunk(records, 1)`` feeds the captured side a byte at a time too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from capture_edits import worker_streams

from pp1q.core.errors import RemoteProtocolError
from pp1q.runtime.capture import Role
from pp1q.tools.replay.answer_matcher import AnswerMatcher
from pp1q.tools.replay.answers import HANDSHAKE, answer_of
from pp1q.tools.replay.live_core import Connect, LiveReplay, ReplayStopError, Wait
from pp1q.tools.replay.live_report import LiveReport
from pp1q.tools.replay.live_script import Close, Send
from pp1q.wire import HEADER_BYTES, MAGIC, FrameDecoder, HelloAnswer, Step, read_header


@dataclasses.dataclass
class Result:
    report: LiveReport
    fatal: str | None  # the LiveError line, less "worker HOST:PORT "


_UNFRAMED = object()  # bytes that are not a whole frame: sent when they come


class _Worker:
    """The live worker of one connection: the bytes it sends, how far it has sent them,
    and the steps it was asked (the handshake, each STEP the replay sent)."""

    def __init__(self, core: LiveReplay, conn: int, hello, data: bytes, closes: bool,
                 piece: int | None) -> None:
        self.core, self.conn, self.data, self.closes, self.piece = (core, conn, data, closes,
                                                                    piece)
        self.limits = hello.limits  # then the session's: what the replay decodes with
        self.asked: set = {HANDSHAKE}
        self.fed = 0
        self.read = True  # the replay still reads it

    def asked_for(self, msg) -> None:
        if isinstance(msg, Step):
            self.asked.add((msg.slot, msg.generation, msg.round_id))

    def answer(self) -> None:
        """Send, in order, all it may by now; close once all is sent, if it closes."""
        while self.fed < len(self.data) and self.read:
            frame = self.data[self.fed:self.fed + _frame_bytes(self.data, self.fed)]
            key = self._key(frame)
            if key is not _UNFRAMED and key not in self.asked:
                return  # an answer to a STEP not sent yet
            step = self.piece or len(frame)
            for k in range(0, len(frame), step):
                self.read = self.read and self.core.received(self.conn, frame[k:k + step])
            self.fed += len(frame)
        if self.closes and self.fed >= len(self.data):
            self.core.ended(self.conn)

    def _key(self, raw: bytes):
        try:
            decoded = FrameDecoder(self.limits).feed_frames(raw)
        except RemoteProtocolError:
            return _UNFRAMED
        if not decoded:
            return _UNFRAMED
        msg = decoded[0].message
        if isinstance(msg, HelloAnswer) and msg.limits.max_context:
            self.limits = msg.limits
        return answer_of(decoded[0]).key


def _frame_bytes(data: bytes, at: int) -> int:
    if len(data) - at >= HEADER_BYTES and data[at:at + len(MAGIC)] == MAGIC:
        return read_header(data, at).frame_bytes
    return len(data) - at  # not a frame: the rest in one read


def replay(role: Role, records: Iterable, *, live: dict[int, bytes] | None = None,
           closes: Iterable[int] = (), piece: int | None = None,
           matcher: type[AnswerMatcher] = AnswerMatcher) -> Result:
    core = LiveReplay(role, records, worker="sans-io", matcher=matcher)
    live, closes = dict(live or {}), set(closes)
    workers: dict[int, _Worker] = {}
    try:
        for cmd in core.commands():
            if isinstance(cmd, Connect):
                workers[cmd.conn] = _Worker(core, cmd.conn, cmd.hello,
                                            live.get(cmd.conn, b""), cmd.conn in closes,
                                            piece)
            elif isinstance(cmd, Send):
                workers[cmd.conn].asked_for(cmd.message)
                workers[cmd.conn].answer()
            elif isinstance(cmd, Wait):
                workers[cmd.conn].answer()
            elif isinstance(cmd, Close):
                del workers[cmd.conn]
    except ReplayStopError as e:
        return Result(core.report, str(e))
    return Result(core.report, None)


def self_replay(role: Role, records: list, **kw) -> Result:
    """The capture against a live worker that sends what its captured worker did (the
    ``live`` streams given replace a connection's)."""
    kw["live"] = {**worker_streams(role, records), **kw.get("live", {})}
    return replay(role, records, **kw)


__all__ = ["Result", "replay", "self_replay"]
