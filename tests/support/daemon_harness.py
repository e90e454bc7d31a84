"""Real daemon processes on 127.0.0.1 for the tests, a /metrics scraper and a tiny
fault-injecting TCP proxy (etcd's pkg/proxy is the model; issue 7 builds the full one)."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import struct
import sys
import threading
from pathlib import Path

from pp1q.runtime.launcher import DaemonProcess, pp1q_command
from pp1q.tools.chaos.rig import scrape, value  # noqa: F401 - the tests import both from here
from pp1q.tools.client import Client
from pp1q.wire.context_channel import PREAMBLE

ROOT = Path(__file__).resolve().parents[2]
CONNECT_TIMEOUT_S = 30.0  # both daemons start in ~1 s here; generous for a loaded CI box
REQUEST_TIMEOUT_S = 60.0  # one test request; far above any round with these toy models


class Pair:
    """A worker and a verifier (optionally through a proxy), as child processes."""

    def __init__(self, tmp: Path, *, vocab: int = 16, model_seed: int = 0,
                 preset: str = "far", verifier_args=(), worker_args=(),
                 verifier_cmd: list[str] | None = None, proxy: FaultProxy | None = None,
                 wait: bool = True, worker_cmd: list[str] | None = None) -> None:
        self.tmp, self.vocab = tmp, vocab
        self.worker_cmd = worker_cmd or pp1q_command("worker")
        self.worker_args = ["--vocab", str(vocab), "--model-seed", str(model_seed),
                            "--draft-preset", preset, "--metrics-port", "0", *worker_args]
        self.worker = self.start_worker("127.0.0.1:0")
        self.proxy = proxy
        upstream = self.worker.port
        if proxy is not None:
            proxy.start(upstream)
        target = proxy.port if proxy is not None else upstream
        args = ["--worker", f"127.0.0.1:{target}", "--http", "127.0.0.1:0", "--vocab",
                str(vocab), "--model-seed", "0", "--metrics-port", "0",
                "--reconnect-max-s", "0.2", *verifier_args]
        cmd = (verifier_cmd or pp1q_command("verifier")) + args
        self.verifier = DaemonProcess("verifier", cmd, str(tmp / "verifier.log"), cwd=str(ROOT))
        self.url = f"http://127.0.0.1:{self.verifier.port}"
        if wait:
            self.client().wait_connected(CONNECT_TIMEOUT_S)

    def start_worker(self, listen: str) -> DaemonProcess:
        n = len(list(self.tmp.glob("worker*.log")))
        return DaemonProcess("worker", [*self.worker_cmd, "--listen", listen,
                                        *self.worker_args],
                             str(self.tmp / f"worker{n}.log"))

    def client(self) -> Client:
        return Client(self.url, timeout=REQUEST_TIMEOUT_S)

    def generate_many(self, bodies: list[dict], concurrency: int = 4) -> list[dict]:
        """POST every body (prompt, max_tokens and options), ``concurrency`` at a time."""
        local = threading.local()

        def one(body: dict) -> dict:
            if not hasattr(local, "client"):
                local.client = self.client()
            body = dict(body)
            return local.client.generate(body.pop("prompt"), body.pop("max_tokens"), **body)

        with cf.ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(one, bodies))

    def metrics(self, role: str) -> dict[tuple, float]:
        return scrape(getattr(self, role).metrics_port)

    def close(self) -> None:
        self.verifier.stop()
        self.worker.stop()
        if self.proxy is not None:
            self.proxy.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {d.role}\n{d.log_tail(40)}" for d in (self.worker, self.verifier))


# ---------------------------------------------------------------------------
# fault proxy

_HEAD = struct.Struct("<4sBBHII")  # magic, version, type, flags, control_len, payload_len
_HEADER_BYTES = 32
REPLY, COMPLETION = 4, 5  # wire message types (pp1q.wire.MsgType)


class Fault:
    """One fault on the worker -> verifier stream of the first wire connection.

    kind "corrupt": flip one bit of payload byte ``offset`` of the ``nth`` frame of
    ``msg_type``; "delay": deliver that frame ``seconds`` late while later frames pass
    (a late frame, as a stalled path or a retransmission storm would leave it);
    "hold": hold it until the worker side closes, then drop it and close (a crash).
    """

    def __init__(self, kind: str, msg_type: int, nth: int = 1, offset: int = 0,
                 seconds: float = 0.0) -> None:
        self.kind, self.msg_type, self.nth = kind, msg_type, nth
        self.offset, self.seconds = offset, seconds
        self.seen = 0
        self.fired = threading.Event()


class FaultProxy:
    """TCP proxy on 127.0.0.1 in its own thread and event loop."""

    def __init__(self, fault: Fault | None = None) -> None:
        self.fault = fault
        self.port: int | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server = None
        self._wire_connections = 0

    def start(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        self.port = fut.result(10)

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        async def close():
            self._server.close()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _serve(self, c_reader, c_writer) -> None:
        try:
            u_reader, u_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            c_writer.close()
            return
        try:
            first = await c_reader.readexactly(len(PREAMBLE))
        except (asyncio.IncompleteReadError, ConnectionError):
            c_writer.close()
            u_writer.close()
            return
        u_writer.write(first)
        wire = first != PREAMBLE
        fault = None
        if wire:
            self._wire_connections += 1
            fault = self.fault if self._wire_connections == 1 else None
        up = asyncio.ensure_future(self._pipe(c_reader, u_writer))
        down = asyncio.ensure_future(self._frames(u_reader, c_writer, fault) if wire
                                     else self._pipe(u_reader, c_writer))
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for t in (up, down):
            t.cancel()
        c_writer.close()
        u_writer.close()

    @staticmethod
    async def _pipe(reader, writer) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()

    async def _frames(self, reader, writer, fault: Fault | None) -> None:
        """Forward whole frames, applying ``fault`` to the chosen one."""
        buf = bytearray()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                buf += data
                while len(buf) >= _HEADER_BYTES:
                    _, _, mtype, _, clen, plen = _HEAD.unpack_from(buf)
                    n = _HEADER_BYTES + clen + plen
                    if len(buf) < n:
                        break
                    frame, buf = bytearray(buf[:n]), buf[n:]
                    if fault is not None and mtype == fault.msg_type:
                        fault.seen += 1
                        if fault.seen == fault.nth:
                            fault.fired.set()
                            if fault.kind == "corrupt":
                                frame[_HEADER_BYTES + clen + fault.offset] ^= 0x01
                            elif fault.kind == "delay":
                                loop.call_later(fault.seconds, writer.write, bytes(frame))
                                continue
                            else:  # "hold" until the worker's side closes, then drop
                                while await reader.read(65536):
                                    pass
                                return
                    writer.write(frame)
                    await writer.drain()


def planted_worker_command() -> list[str]:
    """The worker with a planted proposal bug (tests/support/planted_worker.py)."""
    return [sys.executable, str(ROOT / "tests" / "support" / "planted_worker.py")]


def planted_verifier_command() -> list[str]:
    """The verifier with a planted verification bug (tests/support/planted_verifier.py)."""
    return [sys.executable, str(ROOT / "tests" / "support" / "planted_verifier.py")]


FAULT_PROMPT = [3, 7]  # the fault tests' prompt (as the distribution experiment's)


def one_request(pair: Pair, max_tokens: int = 12, seed: int = 1, **options) -> dict:
    """One generate request through a fresh client."""
    client = pair.client()
    try:
        return client.generate(FAULT_PROMPT, max_tokens, seed=seed, **options)
    finally:
        client.close()


def fallbacks_of(answer: dict) -> dict:
    """The non-zero fallback counts of one answer's stats."""
    return {k: v for k, v in answer["stats"]["fallbacks"].items() if v}
