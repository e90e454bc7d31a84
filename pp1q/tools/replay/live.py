"""``pp1q replay FILE --worker HOST:PORT``: the verifier's side of a capture against a
live worker over TCP, its answers compared with the captured ones.

The thin asyncio part of it: the replay's course is ``LiveReplay``'s (sans-IO:
``live_core.py``, and under it ``live_script.py``, ``live_stream.py``,
``answer_matcher.py``, ``step_match.py``, ``answers.py``); this does its commands. A
TCP connection per captured connection, opened at its HELLO (the captured frame itself,
session id included: the worker answers a session, not a verifier); the captured
verifier frames written as they come; the worker's bytes read by one task per
connection and handed to the core; each wait for the answers the capture shows before
the next frame bounded by ``wait_s``.

Where the core stops the replay (a worker that does not speak the wire, refuses or
ends the session the capture shows going on, closes the connection with an answer due,
or leaves an answer unsent for ``wait_s``), and where the worker cannot be reached, this
raises ``LiveError`` (``pp1q replay`` exit status 3): nothing after it can be compared.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterable

from pp1q.runtime.capture import Record, Role
from pp1q.runtime.tls import ClientTls, connect_kwargs
from pp1q.tools.replay.live_core import Connect, LiveReplay, ReplayStopError, Wait
from pp1q.tools.replay.live_report import LiveReport
from pp1q.tools.replay.live_script import Close, Send

DEFAULT_WAIT_S = 5.0  # per wait for owed answers: a toy round takes milliseconds
READ_BYTES = 1 << 20  # one read's most (a dense row at vocabulary 129280 is 517 KB)
CLOSE_WAIT_S = 1.0  # for our end of a connection to close
# for the worker's own close after our half-close: it releases the session then, and a
# replay of the same capture right after would otherwise meet it live (session_in_use)
WORKER_CLOSE_WAIT_S = 2.0


class LiveError(Exception):
    """The live worker cannot be replayed against: one line for the operator."""


class LiveLink:
    """One live connection, standing for one captured connection: its bytes go to the
    replay's core as they come."""

    def __init__(self, conn: int, core: LiveReplay, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.conn, self.core = conn, core
        self.reader, self.writer = reader, writer
        self.arrived = asyncio.Event()  # a read came, or the stream ended
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, conn: int, host: str, port: int, core: LiveReplay,
                      wait_s: float, tls: ClientTls | None = None) -> LiveLink:
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
        return cls(conn, core, reader, writer)

    async def _read(self) -> None:
        try:
            while data := await self.reader.read(READ_BYTES):
                if not self.core.received(self.conn, data):
                    break  # given up: what it sends cannot be compared
                self.arrived.set()
        except OSError:
            pass  # reset by the worker: the same as its close here
        finally:
            self.core.ended(self.conn)
            self.arrived.set()

    def write(self, raw: bytes) -> None:
        self.writer.write(raw)

    async def wait(self, wait_s: float) -> None:
        """Wait while the core waits for the worker's answers, at most ``wait_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while self.core.waiting(self.conn) and (left := deadline - loop.time()) > 0:
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), left)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._until_worker_closed()
        self.writer.close()
        with contextlib.suppress(OSError, TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(self.writer.wait_closed(), CLOSE_WAIT_S)

    async def _until_worker_closed(self) -> None:
        """Half-close and read (unread: the capture shows nothing more) until the worker
        closes too, ``WORKER_CLOSE_WAIT_S`` at most. Over TLS there is no half-close: the
        connection is closed at once, and a replay right after may still meet its
        session live on a loaded worker."""
        if self.reader.at_eof() or not self.writer.can_write_eof():
            return
        with contextlib.suppress(OSError, TimeoutError):
            self.writer.write_eof()
            async with asyncio.timeout(WORKER_CLOSE_WAIT_S):
                while await self.reader.read(READ_BYTES):
                    pass


async def replay_live(role: Role, records: Iterable[Record], host: str, port: int, *,
                      wait_s: float = DEFAULT_WAIT_S, tls: ClientTls | None = None
                      ) -> LiveReport:
    """Replay every captured connection against the worker at ``host:port`` (over mutual
    TLS with ``tls``, as the verifier daemon connects: pp1q.runtime.tls)."""
    worker = f"{host}:{port}"
    core = LiveReplay(role, records, worker=worker, wait_s=wait_s)
    links: dict[int, LiveLink] = {}
    try:
        for cmd in core.commands():
            if isinstance(cmd, Connect):
                links[cmd.conn] = await LiveLink.connect(cmd.conn, host, port, core, wait_s,
                                                         tls)
            elif isinstance(cmd, Wait):
                await links[cmd.conn].wait(wait_s)
            elif isinstance(cmd, Send):
                links[cmd.conn].write(cmd.raw)
            elif isinstance(cmd, Close):
                await links.pop(cmd.conn).close()
    except ReplayStopError as e:
        hint = ("; a worker serving mutual TLS closes a plain connection so: pass "
                "--tls-cert, --tls-key and --tls-ca" if tls is None
                and str(e).endswith("before answering the HELLO") else "")
        raise LiveError(f"worker {worker} {e}{hint}") from None
    finally:
        for link in links.values():
            await link.close()
    return core.report


__all__ = ["DEFAULT_WAIT_S", "LiveError", "LiveLink", "replay_live"]
