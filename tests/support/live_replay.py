"""A live replay without a socket: pp1q.tools.replay.live's sequence on its sans-IO core.

``replay(role, records, live=...)`` runs a capture's script (live_script) into an
AnswerMatcher and plays each connection's live worker with a LiveStream, fed from the
bytes that worker sends (``live``: by default none; ``self_replay`` gives it the
captured worker's own). It sends them in order as soon as it may: a frame once the
replay has sent what it answers (the HELLO, its STEP), bytes that do not frame when
they come. Reads are a frame each (``piece`` None; bytes that do not frame go in one
read) or ``piece`` bytes.
A connection in ``closes`` is closed by its worker once its bytes are all sent. What
the adapter does at each frame it sends (``catch_up``, ``usable``), at a capture's
CLOSE, at a ``Broken`` stream and at a capture file that breaks is done here through the
same matcher calls; the line it would raise ``LiveError`` with (exit status 3) comes
back as ``Result.fatal``.

``capture_edits.rechunk(records, 1)`` feeds the captured side a byte at a time too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from capture_edits import worker_streams

from pp1q.core.errors import RemoteProtocolError
from pp1q.runtime.capture import CaptureError, Role
from pp1q.tools.replay.answer_matcher import AnswerMatcher, step_label
from pp1q.tools.replay.answers import HANDSHAKE, answer_of
from pp1q.tools.replay.live_report import LiveReport
from pp1q.tools.replay.live_script import Broken, Captured, Close, Send, script
from pp1q.tools.replay.live_stream import LiveStream
from pp1q.wire import HEADER_BYTES, MAGIC, FrameDecoder, Step, read_header


@dataclasses.dataclass
class Result:
    report: LiveReport
    fatal: str | None  # the LiveError line, less "worker HOST:PORT "


class _StopError(Exception):
    """A LiveError of the adapter: nothing after it is replayed."""


_UNFRAMED = object()  # bytes that are not a whole frame: sent when they come


class _Worker:
    """The live worker of one connection: the bytes it sends, how far it has sent them,
    and the steps it was asked (the handshake, each STEP the replay sent)."""

    def __init__(self, conn: int, matcher: AnswerMatcher, hello, data: bytes,
                 closes: bool, piece: int | None) -> None:
        self.conn, self.data, self.closes, self.piece = conn, data, closes, piece
        self.stream = LiveStream(conn, matcher, hello.limits)
        self.asked: set = {HANDSHAKE}
        self.fed = 0
        self.given_up = False

    def asked_for(self, msg) -> None:
        if isinstance(msg, Step):
            self.asked.add((msg.slot, msg.generation, msg.round_id))

    def answer(self) -> None:
        """Send, in order, all it may by now."""
        while self.more:
            frame = self.data[self.fed:self.fed + _frame_bytes(self.data, self.fed)]
            key = self._key(frame)
            if key is not _UNFRAMED and key not in self.asked:
                return  # an answer to a STEP not sent yet
            read = self.piece or len(frame)
            for k in range(0, len(frame), read):
                if not self.given_up:
                    self.given_up = not self.stream.feed(frame[k:k + read])
            self.fed += len(frame)

    def _key(self, raw: bytes):
        try:
            decoded = FrameDecoder(self.stream.decoder.limits).feed_frames(raw)
        except RemoteProtocolError:
            return _UNFRAMED
        return answer_of(decoded[0]).key if decoded else _UNFRAMED

    @property
    def more(self) -> bool:
        return self.fed < len(self.data) and not self.given_up

    @property
    def ended(self) -> bool:
        return self.closes and self.fed >= len(self.data)


def _frame_bytes(data: bytes, at: int) -> int:
    if len(data) - at >= HEADER_BYTES and data[at:at + len(MAGIC)] == MAGIC:
        return read_header(data, at).frame_bytes
    return len(data) - at  # not a frame: the rest in one read


def replay(role: Role, records: Iterable, *, live: dict[int, bytes] | None = None,
           closes: Iterable[int] = (), piece: int | None = None,
           matcher: type[AnswerMatcher] = AnswerMatcher) -> Result:
    m = matcher(LiveReport(worker="sans-io"))
    live, closes = dict(live or {}), set(closes)
    workers: dict[int, _Worker] = {}
    broken: set[int] = set()  # connections whose captured stream broke: nothing more sent

    def catch_up(w: _Worker) -> None:  # LiveLink.catch_up, once the worker sent all it may
        w.answer()
        fatal = m.fatal(w.conn)
        if fatal is not None:
            raise _StopError(fatal)
        owed = m.owed(w.conn)
        if w.given_up or not owed:
            return
        if not w.ended:
            raise _StopError(f"silent: no answer to {step_label(owed[0])}")
        why = m.worker_closed(w.conn)
        if why is not None:
            raise _StopError(why)
        w.given_up = True

    def usable(w: _Worker, msg) -> bool:  # LiveLink.usable
        if w.ended and not w.given_up:
            why = m.worker_closed(w.conn, msg)
            if why is not None:
                raise _StopError(why)
        return not (w.ended or w.given_up)

    def end(conn: int) -> None:
        w = workers.pop(conn, None)
        if w is None:
            return
        catch_up(w)
        m.close(conn)

    try:
        try:
            for act in script(role, records):
                if isinstance(act, Captured):
                    if m.is_open(act.conn):
                        m.captured(act.conn, act.answer)
                elif isinstance(act, Send):
                    if act.opens and act.conn not in workers and not m.is_open(act.conn) \
                            and act.conn not in broken:
                        m.open(act.conn)
                        workers[act.conn] = _Worker(act.conn, m, act.message,
                                                    live.get(act.conn, b""),
                                                    act.conn in closes, piece)
                    w = workers.get(act.conn)
                    if w is None:
                        continue
                    catch_up(w)
                    if usable(w, act.message):
                        m.sent(act.conn, act.message)
                        w.asked_for(act.message)
                        w.answer()
                elif isinstance(act, Broken):
                    if act.conn not in broken:
                        m.capture_broken(f"c{act.conn}: {act.what}")
                        end(act.conn)
                        broken.add(act.conn)
                elif isinstance(act, Close):
                    end(act.conn)
        except CaptureError as e:
            m.capture_broken(str(e))
        for conn in list(workers):
            end(conn)
    except _StopError as e:
        return Result(m.report, str(e))
    return Result(m.report, None)


def self_replay(role: Role, records: list, **kw) -> Result:
    """The capture against a live worker that sends what its captured worker did (the
    ``live`` streams given replace a connection's)."""
    kw["live"] = {**worker_streams(role, records), **kw.get("live", {})}
    return replay(role, records, **kw)


__all__ = ["Result", "replay", "self_replay"]
