"""Start the daemons as child processes and learn their ports (demo, tests, benchmarks).

Each daemon prints one line when it listens, naming its ports (``pp1q worker listening
on HOST:PORT metrics on HOST:PORT``, ``pp1q verifier HTTP on HOST:PORT, ... metrics on
HOST:PORT``); binding port 0 and reading that line avoids port races.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

from pp1q.runtime import malloc

STARTUP_TIMEOUT_S = 60.0  # toy weights at 129280 tokens take a few seconds on a small CPU
STOP_TIMEOUT_S = 10.0  # SIGTERM, then SIGKILL after this long
_PORT_LINE = re.compile(r"(?:listening on|HTTP on) [^ ]*:(\d+).*?(?:metrics on [^ ]*:(\d+))?$")


def pp1q_command(role: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "pp1q.cli", role, *args]


# Defaults for a daemon child, each kept if the caller's environment sets it. Measured on
# the 2-core reference machine (BENCHMARKS.md, Kernels): spinning OpenMP workers of two
# daemons steal each other's cores (torch ops 5-20x slower under load); fresh mmap'd
# temporaries of a few MB page-fault on every round of the kernel decider (~2x).
DAEMON_ENV_DEFAULTS = {
    "OPENBLAS_NUM_THREADS": "1",  # see pp1q.cli.worker
    "OMP_WAIT_POLICY": "PASSIVE",
    **{name: str(value) for name, value in malloc.ENV.items()},  # at exec, before any malloc
}


def daemon_env() -> dict[str, str]:
    """The child's environment: DAEMON_ENV_DEFAULTS under the caller's own settings."""
    return {**DAEMON_ENV_DEFAULTS, **os.environ}


class DaemonProcess:
    """A daemon child whose first stdout line names its ports; stderr goes to ``log_path``."""

    def __init__(self, role: str, cmd: list[str], log_path: str, cwd: str | None = None,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """``startup_timeout_s``: how long its first line may take (a rank group of a
        real model loads the checkpoint on every rank before rank 0 prints it)."""
        self.role, self.log_path = role, log_path
        self.startup_timeout_s = startup_timeout_s
        self._log = open(log_path, "w")  # noqa: SIM115 - lives as long as the child
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     env=daemon_env(), cwd=cwd)
        self.port: int | None = None
        self.metrics_port: int | None = None
        line = self._first_line()
        m = _PORT_LINE.search(line)
        if not m:
            self.stop()
            raise RuntimeError(f"{role} did not start ({line!r}); log:\n{self.log_tail()}")
        self.port = int(m.group(1))
        self.metrics_port = int(m.group(2)) if m.group(2) else None
        threading.Thread(target=self._drain, daemon=True).start()

    def _first_line(self) -> str:
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(self.startup_timeout_s)
        return box[0].strip() if box else ""

    def _drain(self) -> None:
        for _ in self.proc.stdout:
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the process dies mid-whatever, as a crash would."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)
        self._log.flush()

    def stop(self) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        if not self._log.closed:
            self._log.close()

    def log_tail(self, lines: int = 20) -> str:
        if not self._log.closed:  # stop() closes it; the file is still there to read
            self._log.flush()
        with open(self.log_path) as f:
            return "".join(f.readlines()[-lines:])


def start_pair(log_dir: str, *, vocab: int = 129280, model_seed: int = 0, preset: str = "close",
               top_k: int = 32, target_delay_ms: float = 0.0,
               connect_timeout: float = STARTUP_TIMEOUT_S, ranks: int = 1,
               model: list[str] | None = None, verifier_args: list[str] | tuple = (),
               cores: tuple[str, str] | None = None):
    """A worker and a verifier on loopback (ports picked by the OS), connected.

    ``model``: options naming a real model for both daemons (``--model ... --draft ...``)
    instead of the toy pair's; ``verifier_args``: more verifier options; ``cores``:
    (worker, verifier) CPU lists for ``taskset -c`` (each daemon on its own cores).
    Returns (worker, verifier, url); both are stopped again if the pair does not come up.
    """
    from pp1q.runtime.draw_secret import write_secret_file
    from pp1q.tools.client import Client

    # sampled speculation is enabled explicitly on both ends (never a default)
    common = ["--metrics-port", "0", "--speculation", "sampled"]
    if model is None:
        common += ["--vocab", str(vocab), "--model-seed", str(model_seed)]
        worker_toy = ["--draft-preset", preset]
        verifier_toy = ["--target-delay-ms", str(target_delay_ms)]
    else:
        common += list(model)
        worker_toy = verifier_toy = []
    pin = (["taskset", "-c", cores[0]], ["taskset", "-c", cores[1]]) if cores else ([], [])
    secret = os.path.join(log_dir, "draw.secret")  # a fresh draw secret for this pair
    write_secret_file(secret)
    worker = DaemonProcess("worker", pin[0] + pp1q_command(
        "worker", "--listen", "127.0.0.1:0", *worker_toy, *common),
        os.path.join(log_dir, "worker.log"))
    try:
        verifier = DaemonProcess("verifier", pin[1] + pp1q_command(
            "verifier", "--worker", f"127.0.0.1:{worker.port}", "--http", "127.0.0.1:0",
            "--top-k", str(top_k), "--ranks", str(ranks), "--draw-secret-file", secret,
            *verifier_toy, *verifier_args, *common),
            os.path.join(log_dir, "verifier.log"))
    except BaseException:
        worker.stop()
        raise
    url = f"http://127.0.0.1:{verifier.port}"
    client = Client(url, timeout=5)
    try:
        client.wait_connected(connect_timeout)
    except BaseException:
        verifier.stop()
        worker.stop()
        raise
    finally:
        client.close()
    return worker, verifier, url


def run_together(commands: list[list[str]], timeout_s: float,
                 env: dict[str, str] | None = None) -> list[int]:
    """Start every command at once (a rank group's processes), wait for all of them and
    return their exit codes; whatever still runs at the timeout is killed (and raises
    subprocess.TimeoutExpired), so no rank outlives its caller."""
    procs = [subprocess.Popen(cmd, env=env) for cmd in commands]
    try:
        return [p.wait(timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def demo_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    """n prompts of 8 token ids, drawn from ``seed``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, size=8)] for _ in range(n)]
