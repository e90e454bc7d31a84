"""``pp1q replay FILE --worker HOST:PORT``: the verifier's side of a capture against a
live worker over TCP, its answers compared with the captured ones.

The thin asyncio part: one TCP connection per captured connection, opened at its HELLO
(the captured frame itself, session id included: the worker answers a session, not a
verifier), the captured verifier frames written in order, the worker's bytes read by
one task per connection into a ``LiveStream`` and so to the ``AnswerMatcher`` (sans-IO:
``live_stream.py``, ``answer_matcher.py``, ``step_match.py``, ``answers.py``). Before
each frame it writes, the replay waits for the answers the capture shows before it
(``AnswerMatcher.owed``), at most ``wait_s`` each time.

A worker that cannot be reached, does not speak the wire, refuses (or ends) the session
the capture shows going on, closes the connection with an answer due (unless an answer
already differed: then its consequence, reported with it) or leaves an answer unsent for
``wait_s`` raises ``LiveError`` (``pp1q replay`` exit status 3): nothing after it can be
compared. A close with no answer due is a note. A capture that breaks part-way (a stream
of it that does not decode, a file cut or corrupt) is replayed up to there, and the
report says so (exit status 2).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterable

from pp1q.runtime.capture import CaptureError, Record, Role
from pp1q.runtime.tls import ClientTls, connect_kwargs
from pp1q.tools.replay.answer_matcher import AnswerMatcher, step_label
from pp1q.tools.replay.live_report import LiveReport
from pp1q.tools.replay.live_script import Broken, Captured, Close, Send, script
from pp1q.tools.replay.live_stream import LiveStream
from pp1q.wire import Hello, Limits

DEFAULT_WAIT_S = 5.0  # per wait for owed answers: a toy round takes milliseconds
READ_BYTES = 1 << 20  # one read's most (a dense row at vocabulary 129280 is 517 KB)
CLOSE_WAIT_S = 1.0  # for our end of a connection to close


class LiveError(Exception):
    """The live worker cannot be replayed against: one line for the operator."""


class LiveLink:
    """One live connection, standing for one captured connection."""

    def __init__(self, conn: int, worker: str, matcher: AnswerMatcher, limits: Limits,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.conn, self.worker, self.matcher = conn, worker, matcher
        self.reader, self.writer = reader, writer
        self.stream = LiveStream(conn, matcher, limits)  # the captured HELLO's limits
        self.arrived = asyncio.Event()  # a frame came, or the stream ended
        self.ended = False  # the worker closed the connection
        self.given_up = False  # we stopped reading: what it sent cannot be compared
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, conn: int, host: str, port: int, matcher: AnswerMatcher,
                      hello: Hello, wait_s: float, tls: ClientTls | None = None) -> LiveLink:
        worker = f"{host}:{port}"
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=READ_BYTES, **connect_kwargs(tls)),
                wait_s)
        except TimeoutError:
            raise LiveError(f"worker {worker} unreachable: no connection within "
                            f"{wait_s:g} s") from None
        except ssl.SSLError as e:  # (an OSError too) the worker's certificate refused
            raise LiveError(f"worker {worker}: TLS handshake failed: "
                            f"{e.reason or e}") from None
        except OSError as e:
            raise LiveError(f"worker {worker} unreachable: {e.strerror or e}") from None
        return cls(conn, worker, matcher, hello.limits, reader, writer)

    async def _read(self) -> None:
        try:
            while not self.given_up:
                data = await self.reader.read(READ_BYTES)
                if not data:
                    break
                self.given_up = not self.stream.feed(data)
                self.arrived.set()
        except OSError:
            pass  # reset by the worker: the same as its close here
        finally:
            self.ended = True
            self.arrived.set()

    def write(self, raw: bytes) -> None:
        self.writer.write(raw)

    async def catch_up(self, wait_s: float) -> None:
        """Wait until the worker has sent every answer the capture showed so far."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            fatal = self.matcher.fatal(self.conn)  # first: a stream not the wire is given up
            if fatal is not None:
                raise LiveError(f"worker {self.worker} {fatal}")
            owed = self.matcher.owed(self.conn)
            if self.given_up or not owed:
                return
            if self.ended:
                why = self.matcher.worker_closed(self.conn)
                if why is not None:
                    raise LiveError(f"worker {self.worker} {why}")
                self.given_up = True  # reported with the divergence before it
                return
            left = deadline - loop.time()
            if left <= 0:
                raise LiveError(f"worker {self.worker} silent: no answer to "
                                f"{step_label(owed[0])} within {wait_s:g} s (--wait-s)")
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), left)

    def usable(self, msg) -> bool:
        """Whether ``msg`` can go to the worker now (call after ``catch_up``: no answer is
        due). Not once it closed the connection: noted, and a fault only if the capture
        shows it answering something later (``catch_up`` then raises)."""
        if self.ended and not self.given_up:
            why = self.matcher.worker_closed(self.conn, msg)
            if why is not None:
                raise LiveError(f"worker {self.worker} {why}")
        return not (self.ended or self.given_up)

    async def close(self) -> None:
        self._task.cancel()
        self.writer.close()
        with contextlib.suppress(OSError, TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(self.writer.wait_closed(), CLOSE_WAIT_S)
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def replay_live(role: Role, records: Iterable[Record], host: str, port: int, *,
                      wait_s: float = DEFAULT_WAIT_S, tls: ClientTls | None = None
                      ) -> LiveReport:
    """Replay every captured connection against the worker at ``host:port`` (over mutual
    TLS with ``tls``, as the verifier daemon connects: pp1q.runtime.tls)."""
    matcher = AnswerMatcher(LiveReport(worker=f"{host}:{port}"))
    links: dict[int, LiveLink] = {}
    done: set[int] = set()  # connections replayed (or given up on); nothing more is sent
    skipped: set[int] = set()

    async def end(conn: int) -> None:
        """The capture's connection ended: its answers shown so far, then the close."""
        link = links.pop(conn, None)
        if link is None:
            return
        done.add(conn)
        try:
            await link.catch_up(wait_s)
        finally:
            await link.close()
        matcher.close(conn)

    try:
        try:
            for act in script(role, records):
                if isinstance(act, Captured):
                    if matcher.is_open(act.conn):
                        matcher.captured(act.conn, act.answer)
                elif isinstance(act, Send):
                    if act.opens and act.conn not in links and act.conn not in done:
                        matcher.open(act.conn)
                        links[act.conn] = await LiveLink.connect(
                            act.conn, host, port, matcher, act.message, wait_s, tls)
                    link = links.get(act.conn)
                    if link is None:
                        if act.conn not in done:  # the capture began after its HELLO
                            skipped.add(act.conn)
                        continue
                    await link.catch_up(wait_s)
                    if not link.usable(act.message):
                        continue  # it never reaches the worker: its step is "not sent"
                    link.write(act.raw)
                    matcher.sent(act.conn, act.message)
                elif isinstance(act, Broken):
                    # what it showed before is compared, as at a CLOSE; a connection broken
                    # before its HELLO decoded is a break too, not a connection left out
                    if act.conn not in done:
                        matcher.capture_broken(f"c{act.conn}: {act.what}")
                        await end(act.conn)
                        done.add(act.conn)  # nothing more of it is sent
                elif isinstance(act, Close):
                    await end(act.conn)
        except CaptureError as e:  # the file breaks part-way: nothing after it is read
            matcher.capture_broken(str(e))
        for conn in list(links):  # a capture that ends with connections open
            await end(conn)
    finally:
        for link in links.values():
            await link.close()
    matcher.report.skipped = len(skipped)
    return matcher.report


__all__ = ["DEFAULT_WAIT_S", "LiveError", "LiveLink", "replay_live"]
