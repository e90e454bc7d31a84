"""Real daemon processes on 127.0.0.1 for the tests and a /metrics scraper; faults between
them come from pp1q.tools.chaos's proxy (``Pair(rules=[Rule(...)])``)."""

from __future__ import annotations

import concurrent.futures as cf
import subprocess
import sys
import threading
import time
from pathlib import Path

from pp1q.runtime.draw_secret import write_secret_file
from pp1q.runtime.launcher import STARTUP_TIMEOUT_S, DaemonProcess, daemon_env, pp1q_command
from pp1q.tools.chaos.faults import Rule
from pp1q.tools.chaos.proxy import ThreadedProxy
from pp1q.tools.chaos.rig import scrape, value  # noqa: F401 - the tests import both from here
from pp1q.tools.client import Client

ROOT = Path(__file__).resolve().parents[2]
CONNECT_TIMEOUT_S = 30.0  # both daemons start in ~1 s here; generous for a loaded CI box
REQUEST_TIMEOUT_S = 60.0  # one test request; far above any round with these toy models
REPLAY_TIMEOUT_S = 60.0  # a test's capture, a few hundred frames: well under a second of work


class Pair:
    """A worker and a verifier, as child processes; with ``rules``, the verifier reaches the
    worker through pp1q.tools.chaos's fault proxy applying them."""

    def __init__(self, tmp: Path, *, vocab: int = 16, model_seed: int = 0,
                 preset: str = "far", verifier_args=(), worker_args=(),
                 verifier_cmd: list[str] | None = None, rules: list[Rule] | None = None,
                 wait: bool = True, worker_cmd: list[str] | None = None,
                 startup_s: float = STARTUP_TIMEOUT_S) -> None:
        self.tmp, self.vocab = tmp, vocab
        self.worker_cmd = worker_cmd or pp1q_command("worker")
        # sampled speculation enabled explicitly on both ends; args given later win
        self.worker_args = ["--vocab", str(vocab), "--model-seed", str(model_seed),
                            "--draft-preset", preset, "--metrics-port", "0",
                            "--speculation", "sampled", *worker_args]
        self.draw_secret = tmp / "draw.secret"
        if not self.draw_secret.exists():
            write_secret_file(str(self.draw_secret))
        self.worker = self.start_worker("127.0.0.1:0")
        upstream = self.worker.port
        self.proxy: ThreadedProxy | None = None
        if rules is not None:
            self.proxy = ThreadedProxy(upstream)
            self.proxy.set_rules(rules)
        target = self.proxy.port if self.proxy is not None else upstream
        args = ["--worker", f"127.0.0.1:{target}", "--http", "127.0.0.1:0", "--vocab",
                str(vocab), "--model-seed", "0", "--metrics-port", "0",
                "--reconnect-max-s", "0.2", "--speculation", "sampled",
                "--draw-secret-file", str(self.draw_secret), *verifier_args]
        cmd = (verifier_cmd or pp1q_command("verifier")) + args
        self.verifier = DaemonProcess("verifier", cmd, str(tmp / "verifier.log"), cwd=str(ROOT),
                                      startup_timeout_s=startup_s)
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
# faults: pp1q.tools.chaos's proxy (Pair(rules=[...]) puts one between the daemons)


def wait_fired(rule: Rule, timeout: float) -> bool:
    """Wait until the proxy has fired ``rule`` (it counts on the proxy's thread)."""
    deadline = time.monotonic() + timeout
    while not rule.fired:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def planted_worker_command() -> list[str]:
    """The worker with a planted proposal bug (tests/support/planted_worker.py)."""
    return [sys.executable, str(ROOT / "tests" / "support" / "planted_worker.py")]


def planted_verifier_command(bug: str = "correction_from_target") -> list[str]:
    """The verifier with a planted verification bug (tests/support/planted_verifier.py)."""
    return [sys.executable, str(ROOT / "tests" / "support" / "planted_verifier.py"),
            "--planted", bug]


def planted_steering_command(role: str) -> list[str]:
    """The steering worker or the old-keying verifier (tests/support/planted_steering.py)."""
    return [sys.executable, str(ROOT / "tests" / "support" / "planted_steering.py"), role]


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


def replay(path, *args: str, timeout_s: float = REPLAY_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``pp1q replay PATH ARGS...`` as a child process in the daemons' environment."""
    return subprocess.run(pp1q_command("replay", str(path), *args), capture_output=True,
                          text=True, timeout=timeout_s, env=daemon_env())
