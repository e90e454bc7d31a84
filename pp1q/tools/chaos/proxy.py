"""An in-process asyncio TCP proxy that injects faults between verifier and worker.

Modelled on etcd's pkg/proxy: one listening socket on 127.0.0.1 forwards every accepted
connection to the upstream (the worker), and each direction can be delayed, paused,
blackholed or reset. Every connection is a wire v2 session (since revision 2 the request
context travels in CONTEXT frames on it, since revision 3 a sparse step's proposal may
come as one PROPOSAL frame) and is cut into frames (pp1q.tools.chaos.frames), so frame
faults (``faults.Rule``) hit exactly the frame they name, CONTEXT and PROPOSAL frames
included. Every injection is counted in ``injections`` when it
takes effect on the wire, and an optional ``WireAudit`` sees every frame as delivered.

``FaultProxy`` runs in the caller's event loop (``pp1q chaos proxy``);
``ThreadedProxy`` runs one in its own thread for synchronous code (tests, soak).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures as cf
import contextlib
import itertools
import logging
import socket
import struct
import threading

from pp1q.tools.chaos.audit import WireAudit
from pp1q.tools.chaos.faults import (
    BitFlip,
    Delay,
    Direction,
    Disconnect,
    Drop,
    Duplicate,
    FaultKind,
    Reorder,
    Replay,
    Rule,
    Truncate,
    poisons,
)
from pp1q.tools.chaos.frames import FrameCutter, Piece, flip_bit, truncate_reframed
from pp1q.wire import MsgType

log = logging.getLogger("pp1q.tools.chaos")

READ_BYTES = 256 * 1024  # per read; a dense toy row is far smaller, a 129280 row ~517 KB
_LINGER_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


class _Conn:
    """One proxied connection: both writers and held frames."""

    def __init__(self, cid: int, to_verifier: asyncio.StreamWriter,
                 to_worker: asyncio.StreamWriter) -> None:
        self.cid = cid
        self.writers = {Direction.TO_VERIFIER: to_verifier, Direction.TO_WORKER: to_worker}
        self.closed = False
        self.reordered: dict[tuple, list[Piece]] = collections.defaultdict(list)  # (dir, slot)
        self.replays: list[tuple[Direction, Piece, object]] = []  # copy, its control part
        self.delayed: set[asyncio.Future] = set()  # late frames not yet written

    def reset(self) -> None:
        """RST both sides now (etcd's ResetListener/abort): unsent bytes are lost."""
        if self.closed:
            return
        self.closed = True
        for w in self.writers.values():
            sock = w.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
            w.transport.abort()


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int, *,
                 audit: WireAudit | None = None) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.audit = audit
        self.rules: list[Rule] = []
        self.injections: collections.Counter[FaultKind] = collections.Counter()
        self.connections = 0  # wire connections accepted
        self.blackholed_bytes = 0  # bytes read and discarded while a direction was blackholed
        self.port: int | None = None
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._ids = itertools.count(1)
        self._open = {d: asyncio.Event() for d in Direction}  # cleared while paused
        for ev in self._open.values():
            ev.set()
        self._blackholed: set[Direction] = set()
        self._latency = {d: 0.0 for d in Direction}

    # -- lifecycle ---------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self._conns):
            c.reset()

    # -- stream faults (etcd's PauseTx, BlackholeTx, DelayTx, ResetListener) -------

    def pause(self, direction: Direction) -> None:
        self.injections[FaultKind.PAUSE] += 1
        self._open[direction].clear()

    def unpause(self, direction: Direction) -> None:
        self._open[direction].set()

    def blackhole(self, direction: Direction) -> None:
        self.injections[FaultKind.BLACKHOLE] += 1
        self._blackholed.add(direction)

    def unblackhole(self, direction: Direction) -> None:
        self._blackholed.discard(direction)

    def set_latency(self, direction: Direction, seconds: float) -> None:
        """Every chunk of this direction waits ``seconds`` (order kept)."""
        self._latency[direction] = max(0.0, seconds)

    def delayed(self) -> int:
        """Frames a delay holds that are not written yet (a run waits for them to land
        before it reads counters, so none lands in the next run's)."""
        return sum(len(c.delayed) for c in self._conns if not c.closed)

    def held_replays(self) -> int:
        """Stale copies still waiting for a later generation of their slot (a run sends
        more requests until none is left, so each lands in the row that made it)."""
        return sum(len(c.replays) for c in self._conns if not c.closed)

    def reset_all(self) -> int:
        """RST every wire connection between frames; returns how many."""
        conns = [c for c in self._conns if not c.closed]
        for c in conns:
            c.reset()
        self.injections[FaultKind.RESET] += len(conns)
        return len(conns)

    # -- connections ---------------------------------------------------------------

    async def _serve(self, v_reader: asyncio.StreamReader, v_writer: asyncio.StreamWriter):
        try:
            w_reader, w_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            v_writer.transport.abort()  # worker down: the verifier sees a refused session
            return
        conn = _Conn(next(self._ids), v_writer, w_writer)
        self._conns.add(conn)
        try:
            with contextlib.suppress(ConnectionError):
                self.connections += 1
                pumps = [asyncio.ensure_future(self._pump(conn, d, r))
                         for d, r in ((Direction.TO_WORKER, v_reader),
                                      (Direction.TO_VERIFIER, w_reader))]
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                for p in pumps:
                    p.cancel()
        finally:
            self._conns.discard(conn)
            conn.closed = True
            for w in conn.writers.values():
                w.close()
            if self.audit is not None:
                self.audit.connection_closed(conn.cid)

    async def _pump(self, conn: _Conn, d: Direction, reader: asyncio.StreamReader) -> None:
        writer = conn.writers[d]
        cutter = FrameCutter()
        data = b""
        with contextlib.suppress(ConnectionError):
            while True:
                if data:
                    if self._latency[d]:
                        await asyncio.sleep(self._latency[d])
                    await self._open[d].wait()
                    if conn.closed:
                        return
                    if d in self._blackholed:
                        self.blackholed_bytes += len(data)
                    else:
                        for piece in cutter.feed(data):
                            self._forward(conn, d, piece)
                        await writer.drain()
                data = await reader.read(READ_BYTES)
                if not data:  # EOF: frames still delayed are written before the close
                    if conn.delayed:
                        await asyncio.wait(set(conn.delayed))
                    return

    # -- frames ----------------------------------------------------------------------

    def _forward(self, conn: _Conn, d: Direction, piece: Piece) -> None:
        if conn.closed:
            return
        need = self.audit is not None or any(r.needs_control for r in self.rules) or \
            conn.replays or conn.reordered
        message = piece.message() if piece.is_frame and need else None
        held = self._release_held(conn, d, message) if message is not None else []
        fault = None
        if piece.is_frame:
            for rule in self.rules:
                if rule.consider(d, piece.mtype, message):
                    fault = rule.fault
                    break
        if fault is None:
            self._deliver(conn, d, piece, message, piece.data)
        else:
            if message is None:
                message = piece.message()
            if self.audit is not None and message is not None and \
                    poisons(fault, piece.mtype) and hasattr(message, "generation"):
                self.audit.poison(conn.cid, message)
            self._apply(conn, d, piece, message, fault)
        for late in held:  # reordered frames go out right after the frame that passed them
            self._deliver(conn, d, late, late.message(), late.data, intact=False)
            self.injections[FaultKind.REORDER] += not conn.closed

    def _apply(self, conn: _Conn, d: Direction, piece: Piece, message, fault) -> None:
        kind = fault.kind
        if isinstance(fault, Delay):
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            conn.delayed.add(done)

            def late() -> None:
                conn.delayed.discard(done)
                done.set_result(None)
                self._deliver(conn, d, piece, message, piece.data)
            loop.call_later(fault.seconds, late)
        elif isinstance(fault, Drop):
            pass
        elif isinstance(fault, BitFlip | Truncate) and not _has_region(piece, fault):
            self._deliver(conn, d, piece, message, piece.data)  # nothing to hit: not injected
            return
        elif isinstance(fault, BitFlip):
            self._deliver(conn, d, piece, message,
                          flip_bit(piece, fault.region, fault.offset, fault.bit))
        elif isinstance(fault, Truncate):
            self._deliver(conn, d, piece, message, truncate_reframed(piece, fault.keep))
        elif isinstance(fault, Duplicate):
            self._deliver(conn, d, piece, message, piece.data)
            self._deliver(conn, d, piece, message, piece.data)
        elif isinstance(fault, Replay):
            self._deliver(conn, d, piece, message, piece.data)
            if message is not None and hasattr(message, "generation"):
                conn.replays.append((d, piece, message))
            return  # counted when the stale copy goes out
        elif isinstance(fault, Reorder):
            if message is None or not hasattr(message, "slot"):
                self._deliver(conn, d, piece, message, piece.data)
                return
            conn.reordered[(d, message.slot)].append(piece)
            return  # counted when another frame of the slot has passed it
        elif isinstance(fault, Disconnect):
            keep = len(piece.data) // 2 if fault.keep is None else fault.keep
            conn.writers[d].write(piece.data[:keep])
            conn.reset()
        self.injections[kind] += 1

    def _release_held(self, conn: _Conn, d: Direction, message) -> list[Piece]:
        """Before a frame goes out: write the stale copies whose generation it retires;
        return the frames held for reordering that it passes (same slot)."""
        slot = getattr(message, "slot", None)
        gen = getattr(message, "generation", None)
        if slot is None or gen is None:
            return []
        keep = []
        for entry in conn.replays:
            rd, copy, old = entry
            if rd is d and old.slot == slot and gen > old.generation:
                self._deliver(conn, d, copy, old, copy.data, intact=False)
                self.injections[FaultKind.REPLAY] += 1
            else:
                keep.append(entry)
        conn.replays = keep
        return conn.reordered.pop((d, slot), [])

    def _deliver(self, conn: _Conn, d: Direction, piece: Piece, message, data: bytes,
                 intact: bool | None = None) -> None:
        if conn.closed:
            return
        conn.writers[d].write(data)
        if self.audit is not None and piece.is_frame:
            if message is None:
                message = piece.message()
            ok = data is piece.data if intact is None else intact
            self.audit.delivered(conn.cid, d is Direction.TO_WORKER, piece, message, ok)


def _has_region(piece: Piece, fault) -> bool:
    """A payload to truncate or flip in (REPLY, PROPOSAL rows), a control part to flip in."""
    region = "payload" if isinstance(fault, Truncate) else fault.region
    if region == "payload":
        return len(piece.payload) > 0
    return region == "header" or piece.control_len > 0


class ThreadedProxy:
    """A ``FaultProxy`` on its own event loop thread, driven from synchronous code."""

    def __init__(self, upstream_port: int, *, audit: WireAudit | None = None,
                 upstream_host: str = "127.0.0.1") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pp1q-chaos",
                                        daemon=True)
        self.proxy = FaultProxy(upstream_host, upstream_port, audit=audit)
        self._thread.start()
        self.port = self.call_async(self.proxy.start())

    @property
    def injections(self) -> collections.Counter:
        return self.proxy.injections

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the proxy's loop and return its result."""
        fut: cf.Future = cf.Future()

        def run():
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # handed to the caller's thread
                fut.set_exception(e)
        self._loop.call_soon_threadsafe(run)
        return fut.result(10)

    def call_async(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def set_rules(self, rules: list[Rule]) -> None:
        self.call(setattr, self.proxy, "rules", list(rules))

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.call_async(self.proxy.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __getattr__(self, name):  # pause, blackhole, reset_all, ... run on the loop
        attr = getattr(self.proxy, name)
        if callable(attr) and name in _LOOP_METHODS:
            return lambda *a: self.call(attr, *a)
        return attr


_LOOP_METHODS = {"pause", "unpause", "blackhole", "unblackhole", "set_latency", "reset_all",
                 "delayed", "held_replays"}

__all__ = ["FaultProxy", "ThreadedProxy", "MsgType"]
