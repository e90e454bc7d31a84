"""A worker and a verifier as child processes with the fault proxy between them.

Everything binds 127.0.0.1 with OS-chosen ports (read from each daemon's banner). Both
daemons serve the toy pair, or the real model ``model`` names (the daemons' own options,
``--model ... --draft ...``: pp1q.tools.realmodel.model_args). The verifier always dials
the proxy, so the worker can be killed and restarted on the same
port while the verifier keeps its address. ``metrics`` scrapes /metrics over HTTP;
``rss_kib`` reads VmRSS from /proc/PID/status.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pp1q.runtime.draw_secret import write_secret_file
from pp1q.runtime.launcher import DaemonProcess, pp1q_command
from pp1q.tools.chaos.audit import WireAudit
from pp1q.tools.chaos.proxy import ThreadedProxy
from pp1q.tools.client import ApiError, Client

CONNECT_TIMEOUT_S = 30.0  # both daemons start in ~1 s; generous for a loaded 2-core box
REQUEST_TIMEOUT_S = 120.0  # one request under faults; far above any toy round
RECONNECT_MAX_S = 0.2  # verifier backoff cap: a restarted worker is found quickly
POLL_S = 0.05  # /healthz polling period while waiting for a session
SESSION_HEALTH = ("connected", "degraded")  # /healthz "worker" values with a live session

Samples = dict[tuple, float]


class Rig:
    def __init__(self, log_dir: str | Path, *, vocab: int = 16, model_seed: int = 0,
                 preset: str = "far", watchdog_ms: int = 300, slots: int = 4,
                 top_k: int = 0, target_delay_ms: float = 0.0, audit: bool = True,
                 verifier_cmd: list[str] | None = None, verifier_args=(),
                 model: tuple[str, ...] | list[str] = ()) -> None:
        """``model``: options naming a real model for both daemons (empty: the toy pair
        at ``vocab``, ``model_seed``, ``preset``, ``target_delay_ms``); ``vocab`` is then
        the real model's, for the prompts the rig's users draw."""
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.vocab = vocab
        toy = ["--vocab", str(vocab), "--model-seed", str(model_seed)] if not model else []
        self._worker_args = [*toy, *(model or ["--draft-preset", preset]),
                             "--metrics-port", "0",
                             "--speculation", "sampled"]  # explicit on both ends
        secret = self.log_dir / "draw.secret"
        write_secret_file(str(secret))
        self._starts = 0
        self.worker = self._start_worker("127.0.0.1:0")
        self.audit = WireAudit() if audit else None
        self.proxy = ThreadedProxy(self.worker.port, audit=self.audit)
        self._verifier_cmd = (verifier_cmd or pp1q_command("verifier")) + [
            "--worker", f"127.0.0.1:{self.proxy.port}", "--http", "127.0.0.1:0",
            *toy, "--metrics-port", "0",
            "--slots", str(slots), "--top-k", str(top_k), "--watchdog-ms", str(watchdog_ms),
            "--reconnect-max-s", str(RECONNECT_MAX_S),
            *(model or ["--target-delay-ms", str(target_delay_ms)]),
            "--speculation", "sampled",
            "--draw-secret-file", str(secret), *verifier_args]
        self._verifier_starts = 0
        try:
            self.restart_verifier()
        except BaseException:
            self.proxy.stop()
            self.worker.stop()
            raise

    def _start_worker(self, listen: str) -> DaemonProcess:
        self._starts += 1
        return DaemonProcess("worker", pp1q_command("worker", "--listen", listen,
                                                    *self._worker_args),
                             str(self.log_dir / f"worker{self._starts}.log"))

    def restart_verifier(self) -> None:
        """(Re)start the verifier, as its supervisor would, and wait for its session."""
        self._verifier_starts += 1
        log = self.log_dir / f"verifier{self._verifier_starts}.log"
        self.verifier = DaemonProcess("verifier", self._verifier_cmd, str(log))
        self.url = f"http://127.0.0.1:{self.verifier.port}"
        self.wait_connected()

    def client(self) -> Client:
        return Client(self.url, timeout=REQUEST_TIMEOUT_S)

    def wait_connected(self, timeout: float = CONNECT_TIMEOUT_S) -> None:
        c = self.client()
        try:
            c.wait_connected(timeout)
        finally:
            c.close()

    def wait_session(self, timeout: float = CONNECT_TIMEOUT_S) -> None:
        """Block until the verifier holds a worker session again: /healthz "connected",
        or "degraded" (a session whose last proposals failed, as every open step does
        at a crash: only a later successful round clears that, so waiting for
        "connected" with no request running could wait for ever)."""
        c = self.client()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(ApiError):
                    if c.health().get("worker") in SESSION_HEALTH:
                        return
                time.sleep(POLL_S)
        finally:
            c.close()
        raise RuntimeError(f"no worker session within {timeout:g} s")

    def crash_worker(self) -> None:
        """SIGKILL the worker (mid-whatever, as a crash)."""
        self.worker.kill()

    def restart_worker(self) -> None:
        """A fresh worker on the same port; the verifier reconnects through the proxy."""
        port = self.worker.port
        self.worker.stop()
        self.worker = self._start_worker(f"127.0.0.1:{port}")

    def metrics(self, role: str) -> Samples:
        return scrape(getattr(self, role).metrics_port)

    def rss_kib(self, role: str) -> int:
        return rss_kib(getattr(self, role).proc.pid)

    def logs(self, lines: int = 30) -> str:
        return "\n".join(f"--- {d.role}\n{d.log_tail(lines)}"
                         for d in (self.worker, self.verifier))

    def close(self) -> None:
        self.verifier.stop()
        self.worker.stop()
        self.proxy.stop()


def scrape(port: int) -> Samples:
    """GET /metrics -> {(sample name, sorted label items): value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(after: Samples, before: Samples, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def total(samples: Samples, name: str) -> float:
    """``name`` summed over every label set (``value`` reads one label set exactly)."""
    return sum(v for (n, _labels), v in samples.items() if n == name)


def child_pids(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (a verifier rank 0's spawned ranks)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return sorted(out)


def rss_kib(pid: int) -> int:
    """Resident set size of a process in KiB (VmRSS in /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")
