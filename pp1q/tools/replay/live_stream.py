"""The live worker's bytes on one connection, decoded and handed to the ``AnswerMatcher``
(sans-IO: ``pp1q.tools.replay.live`` feeds it what each read gave, in any pieces).

The decoder is the verifier's: the captured HELLO's limits, then the session's from the
worker's HELLO_ANSWER, as on the endpoints. A stream that stops decoding is not read any
further (nothing after a broken frame can be framed again); what that means is the
matcher's to say (``AnswerMatcher.undecodable``). The first four bytes are checked for
the wire's magic once they are in: the decoder waits for a whole 32-byte header, and a
peer that is not a worker (another service's port) may send fewer and wait, or close.
"""

from __future__ import annotations

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.tools.replay.answer_matcher import AnswerMatcher
from pp1q.tools.replay.answers import answer_of
from pp1q.wire import MAGIC, FrameDecoder, HelloAnswer, Limits


class LiveStream:
    def __init__(self, conn: int, matcher: AnswerMatcher, limits: Limits) -> None:
        self.conn, self.matcher = conn, matcher
        self.decoder = FrameDecoder(limits)
        self.frames = 0  # decoded so far
        self._head = b""  # the stream's first bytes, until they are known to be MAGIC
        self.stopped = False  # nothing more is read: what it sends cannot be compared

    def feed(self, data: bytes) -> bool:
        """The bytes of one read; False once reading stops (see the module docstring, and
        ``AnswerMatcher.live`` for a frame no replay can keep)."""
        if self.stopped:
            return False
        try:
            if len(self._head) < len(MAGIC):
                self._head += bytes(data[:len(MAGIC) - len(self._head)])
                if len(self._head) == len(MAGIC) and self._head != MAGIC:
                    # worded as the decoder's own, which sees the same bytes later
                    raise RemoteProtocolError(Reason.BAD_MAGIC, f"magic {self._head!r}")
            for frame in self.decoder.iter_frames(data):
                self.frames += 1
                msg = frame.message
                if isinstance(msg, HelloAnswer) and msg.limits.max_context:
                    self.decoder.limits = msg.limits
                if not self.matcher.live(self.conn, answer_of(frame)):
                    self.stopped = True
                    break
        except RemoteProtocolError as e:
            self.matcher.undecodable(self.conn, e, self.frames)
            self.stopped = True
        return not self.stopped


__all__ = ["LiveStream"]
