"""A live replay's course, sans-IO: what its driver does next, and what each wait for
the worker's answers came to.

``LiveReplay(role, records).commands()`` walks the capture's script (live_script) and
yields what to do: ``Connect`` a live connection for a captured one (at its HELLO),
``Wait`` for the answers the capture shows the worker owing there before the next
frame, write a ``Send`` (a captured verifier frame, its exact bytes), ``Close`` the live
connection (the captured one ended). The driver hands back what the worker does: the
bytes of each read (``received``) and the end of its stream (``ended``). A wait lasts
while ``waiting``, at most the driver's deadline; what it came to (``after_wait``) is
decided when the driver asks for the next command: the replay goes on, or stops with
``ReplayStopError`` and the line for the operator (``pp1q replay`` exit status 3). A
close with no answer due is a note; a capture that breaks part-way is compared up to
there, and the report says so (exit status 2).

The asyncio adapter (``live.py``: sockets, reads, deadlines) and the tests' simulated
worker (tests/support/live_replay.py) drive the same object, so the sans-IO tests test
this flow, not a copy of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pp1q.runtime.capture import CaptureError, Record, Role
from pp1q.tools.replay.answer_matcher import AnswerMatcher, step_label
from pp1q.tools.replay.live_report import LiveReport
from pp1q.tools.replay.live_script import Broken, Captured, Close, Send, script
from pp1q.tools.replay.live_stream import LiveStream
from pp1q.wire import Hello


@dataclass(frozen=True)
class Connect:
    """Open a live connection standing for captured ``conn``; feed what the worker sends
    on it to ``received``, and its end to ``ended``."""

    conn: int
    hello: Hello  # the captured HELLO, sent next (its limits decode the first answer)


@dataclass(frozen=True)
class Wait:
    """Wait while ``waiting(conn)``, at most the driver's deadline (``--wait-s``)."""

    conn: int


# and two of the script's own actions: write a ``Send``'s bytes; ``Close`` the live
# connection (nothing more is sent or read on it)
Command = Connect | Wait | Send | Close


class ReplayStopError(Exception):
    """Nothing after it can be compared: the operator's line, less "worker HOST:PORT "."""


class _Live:
    """What the replay knows of one live connection."""

    def __init__(self, stream: LiveStream) -> None:
        self.stream = stream
        self.ended = False  # no more bytes come: the worker closed it (or reading ended)
        self.given_up = False  # not read any more: what it sends cannot be compared


class LiveReplay:
    def __init__(self, role: Role, records: Iterable[Record], *, worker: str = "",
                 wait_s: float = 0.0, matcher: type[AnswerMatcher] = AnswerMatcher) -> None:
        self.role, self.records, self.wait_s = role, records, wait_s  # wait_s: for the line
        # a verifier's capture recorded the worker's frames after the network, a worker's
        # as it sent them: only the first can hold the network's copies
        self.matcher = matcher(LiveReport(worker=worker),
                               network_copies=role is Role.VERIFIER)
        self._live: dict[int, _Live] = {}
        self._done: set[int] = set()  # connections replayed or given up: nothing more sent
        self._skipped: set[int] = set()  # captured without their HELLO

    @property
    def report(self) -> LiveReport:
        return self.matcher.report

    # -- what the live worker does --------------------------------------------------------

    def received(self, conn: int, data: bytes) -> bool:
        """The bytes of one read on ``conn``; False: stop reading it."""
        live = self._live.get(conn)
        if live is None or live.given_up:
            return False
        live.given_up = not live.stream.feed(data)
        return not live.given_up

    def ended(self, conn: int) -> None:
        """No more bytes come on ``conn`` (the worker closed or reset it)."""
        live = self._live.get(conn)
        if live is not None:
            live.ended = True

    def waiting(self, conn: int) -> bool:
        """Whether the worker still owes an answer on ``conn`` and may yet send it."""
        live = self._live[conn]
        return (self.matcher.fatal(conn) is None and not live.given_up and not live.ended
                and bool(self.matcher.owed(conn)))

    # -- what the replay does -------------------------------------------------------------

    def after_wait(self, conn: int, before=None) -> str | None:
        """What a ``Wait`` came to, before the replay's next frame on ``conn`` (``before``;
        None: before its close): None, the replay goes on (to send it, if the connection
        is still open), or the fatal line. Still ``waiting`` here: the wait expired."""
        live = self._live[conn]
        fatal = self.matcher.fatal(conn)  # first: a stream not the wire is given up too
        if fatal is not None or live.given_up:
            return fatal
        owed = self.matcher.owed(conn)
        if live.ended:  # the worker closed it: AnswerMatcher.worker_closed says what that is
            why = self.matcher.worker_closed(conn, before)
            # an answer lost after a divergence is reported with it, and the connection
            # given up; with none due it is not: an answer the capture shows later is
            # the fault, at the wait for it
            live.given_up = bool(owed)
            return why
        if owed:
            return (f"silent: no answer to {step_label(owed[0])} within {self.wait_s:g} s "
                    "(--wait-s)")
        return None

    def commands(self) -> Iterator[Command]:
        """The replay, a command at a time; raises ``ReplayStopError`` where it ends early.
        A ``Send`` counts as sent once yielded: write it before feeding another read."""
        m = self.matcher
        try:
            for act in script(self.role, self.records):
                if isinstance(act, Captured):
                    if m.is_open(act.conn):
                        m.captured(act.conn, act.answer)
                elif isinstance(act, Send):
                    yield from self._send(act)
                elif isinstance(act, Broken):
                    # what it showed before is compared, as at a CLOSE; a connection broken
                    # before its HELLO decoded is a break too, not a connection left out
                    if act.conn not in self._done:
                        m.capture_broken(f"c{act.conn}: {act.what}")
                        yield from self._end(act.conn)
                        self._done.add(act.conn)  # nothing more of it is sent
                elif isinstance(act, Close):
                    yield from self._end(act.conn)
        except CaptureError as e:  # the file breaks part-way: nothing after it is read
            m.capture_broken(str(e))
        for conn in list(self._live):  # a capture that ends with connections open
            yield from self._end(conn)

    def _send(self, act: Send) -> Iterator[Command]:
        conn = act.conn
        if act.opens and conn not in self._live and conn not in self._done:
            self.matcher.open(conn)
            self._live[conn] = _Live(LiveStream(conn, self.matcher, act.message.limits))
            yield Connect(conn, act.message)
        if conn not in self._live:
            if conn not in self._done:  # the capture began after its HELLO
                self._skipped.add(conn)
                self.report.skipped = len(self._skipped)
            return
        yield from self._wait(conn, act.message)
        live = self._live[conn]
        if live.ended or live.given_up:
            return  # it never reaches the worker: its step is "not sent"
        self.matcher.sent(conn, act.message)  # before its answer can come
        yield act

    def _wait(self, conn: int, before) -> Iterator[Command]:
        yield Wait(conn)
        why = self.after_wait(conn, before)
        if why is not None:
            raise ReplayStopError(why)

    def _end(self, conn: int) -> Iterator[Command]:
        """The capture's connection ended: its answers shown so far, then the close."""
        if conn not in self._live:
            return
        self._done.add(conn)
        yield from self._wait(conn, None)
        del self._live[conn]
        yield Close(conn)
        self.matcher.close(conn)


__all__ = ["Command", "Connect", "LiveReplay", "ReplayStopError", "Wait"]
