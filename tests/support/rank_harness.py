"""Helpers for the verifier-rank tests: ranked pairs, each rank's /metrics, rank PIDs."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from daemon_harness import Pair, scrape, value

from pp1q.tools.chaos.rig import child_pids  # noqa: F401 - the rank tests import it from here

RANKS = 2
POLL_S = 0.05  # polling step of the waits below; each is bounded by its timeout
WAIT_S = 30.0  # upper bound for an asynchronous effect (a counter, an exit) in these tests


def ranked_pair(tmp: Path, *verifier_args: str, **kw) -> Pair:
    """A worker and a verifier of RANKS ranks (rank 0 spawns the others), on loopback."""
    return Pair(tmp, verifier_args=["--ranks", str(RANKS), *verifier_args], **kw)


def rank_metrics(pair: Pair, rank: int) -> dict:
    """/metrics of ``rank`` (rank 0 is the verifier; the others are found in /healthz)."""
    if rank == 0:
        return pair.metrics("verifier")
    health = pair.client().health()
    host, port = health["ranks"]["metrics"][rank].rsplit(":", 1)
    return scrape(int(port))


def rank_failures(samples: dict) -> float:
    """pp1q_rank_failures_total summed over causes."""
    return sum(v for (name, _), v in samples.items() if name == "pp1q_rank_failures_total")


def log_text(daemon) -> str:
    """A daemon's whole stderr log (also after it stopped)."""
    return Path(daemon.log_path).read_text()


def wait_for(predicate, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def wait_metric(pair: Pair, rank: int, name: str, at_least: float, **labels) -> float:
    box = [0.0]

    def reached() -> bool:
        box[0] = value(rank_metrics(pair, rank), name, **labels)
        return box[0] >= at_least
    wait_for(reached)
    return box[0]


def assert_group_lost_once(pair: Pair, box: dict) -> None:
    """The request in flight when a rank died got 503 ranks_lost, and rank 0 counted one
    lost rank and one failed request."""
    err = box.get("error")
    assert err is not None and (err.status, err.code) == (503, "ranks_lost"), box
    m = rank_metrics(pair, 0)
    assert value(m, "pp1q_rank_failures_total", cause="rank_lost") == 1
    assert value(m, "pp1q_requests_total", outcome="error") == 1


def free_port() -> int:
    """A port free a moment ago (for the explicit form, whose rank 0 needs a fixed one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
