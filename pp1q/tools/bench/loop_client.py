"""The verifier's end of the ``loop`` round: raw's frames through uvloop protocols on both
ends, with no wire core (nothing framed, decoded or checked, no state, no task).

What an event-loop adapter costs a round before any of our code runs: the loop's own
reads, writes and wake-ups on both sides (the peer writes each frame from a loop callback
of its own, as ours' drafting tasks do: pp1q.tools.bench.round_peer's ``loop`` mode).
Against raw (blocking sockets, the same bytes) and ours in the same run it splits a
round into the kernel's share, the event loop's and our own code's.

The client runs its event loop on a thread of its own, so that ``round()`` can be called
between two rounds of ours from inside ours' running loop (``time_side_by_side``'s
``between``), one round of each in turn. A round's time is taken on that thread: from the
STEP stand-in's write to the read that completes the round's bytes (handing the round to
the thread and back is not in it); its bytes are then compared with the frames sent.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from pp1q.tools.bench.round_peer import STEP_BYTES_RAW, Peer, frames

ROUND_TIMEOUT_S = 30.0  # a round (or the connection) not done by then: the peer is broken


class _Receiver(asyncio.BufferedProtocol):
    """Reads a round's bytes into one preallocated buffer; resolves ``done`` with the
    time its last byte arrived."""

    def __init__(self, total: int) -> None:
        self.buf = bytearray(total)
        self.view = memoryview(self.buf)
        self.got = 0
        self.done: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.got:]

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        if self.got == len(self.buf):
            self.got = 0
            if self.done is not None and not self.done.done():
                self.done.set_result(time.perf_counter())

    def connection_lost(self, exc) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("loop peer closed the connection"))


class LoopClient:
    """Rounds over one connection to a ``loop`` peer (round() -> seconds, close())."""

    def __init__(self, form: str) -> None:
        import uvloop

        self.expected = b"".join(head + payload for head, payload in frames(form))
        self.step = bytes(STEP_BYTES_RAW)  # made once, as RawClient's: not a round's work
        self.peer = Peer("loop", form)
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-loop",
                                       daemon=True)
        self.thread.start()
        self.transport = None
        try:
            self.transport, self.receiver = self._call(self.loop.create_connection(
                lambda: _Receiver(len(self.expected)), "127.0.0.1", self.peer.port))
        except BaseException:
            self.close()
            raise

    def _call(self, coro):
        """Run ``coro`` on the client's loop and wait for it (ROUND_TIMEOUT_S at most)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(ROUND_TIMEOUT_S)
        except TimeoutError:
            future.cancel()
            raise RuntimeError(f"loop round: no answer in {ROUND_TIMEOUT_S:g} s") from None

    async def _round(self) -> float:
        self.receiver.done = self.loop.create_future()
        t0 = time.perf_counter()
        self.transport.write(self.step)
        return await self.receiver.done - t0

    def round(self) -> float:
        seconds = self._call(self._round())
        if self.receiver.buf != self.expected:  # not timed: what arrived is what was sent
            raise RuntimeError("loop round: the bytes received differ from the frames sent")
        return seconds

    def close(self) -> None:
        if self.transport is not None:
            self.loop.call_soon_threadsafe(self.transport.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(ROUND_TIMEOUT_S)
        if not self.thread.is_alive():
            self.loop.close()
        self.peer.close()


def describe_loop(t: dict[str, float]) -> str:
    """One line from ``time_side_by_side(..., with_loop=True)``: the loop round against
    the raw rounds taken in turn with it, and ours' round of the same run."""
    return (f"  (the same frames through uvloop on both ends and nothing else, in turn with "
            f"the same raw rounds: {t['loop']:.3f} ms = {t['loop'] / t['raw']:.2f}x raw; "
            f"ours {t['ours']:.3f} ms: the rest, {t['ours'] - t['loop']:.3f} ms, is ours: "
            f"the wire core, its checks and the adapters)")
