"""``pp1q verifier``: the target-side verifier daemon with its HTTP API."""

from __future__ import annotations

import os

# One BLAS thread per daemon: its products are small, and OpenBLAS's spinning worker
# threads otherwise steal the peer daemon's cores (7x slower rows on a 2-core machine).
# Effective because this module is imported before numpy when the daemon starts.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pp1q.cli.worker import add_common_arguments
from pp1q.runtime import tls
from pp1q.runtime.config import hostport

HELP = "run the verifier daemon: HTTP API, scheduler, exact verification of worker drafts"

SETTINGS = {  # key: (type, default); also the TOML keys
    "worker": (str, "127.0.0.1:7070"),
    "http": (str, "127.0.0.1:8080"),
    "metrics_host": (str, "127.0.0.1"),
    "metrics_port": (int, None),
    "vocab": (int, 129280),
    "model_seed": (int, 0),
    "wire_version": (int, 2),
    "slots": (int, 4),
    "depth": (int, 5),
    "top_k": (int, 32),
    "watchdog_ms": (int, 2000),
    "reconnect_max_s": (float, 5.0),
    "target_delay_ms": (float, 0.0),
    "capture": (str, None),
    "log_level": (str, "info"),
    "ranks": (int, 1),
    "rank": (int, None),
    "rank_master": (str, "127.0.0.1:0"),
    "rank_backend": (str, "auto"),
    "rank_timeout_s": (float, 5.0),
    "rank_join_timeout_s": (float, 120.0),
    "rank_exit_grace_s": (float, 2.0),
    **tls.SETTINGS,  # mutual TLS with the worker (off unless all three files are set)
    **tls.VERIFIER_SETTINGS,
}


def add_arguments(p) -> None:
    p.add_argument("--worker", type=hostport, metavar="HOST:PORT",
                   help="the drafter worker to connect to (default 127.0.0.1:7070)")
    p.add_argument("--http", type=hostport, metavar="HOST:PORT",
                   help="HTTP API address (default 127.0.0.1:8080)")
    add_common_arguments(p)
    tls.add_arguments(p, verifier=True)
    p.add_argument("--wire-version", type=int, choices=[1, 2],
                   help="2 (default): sampled speculative decoding with exact q; "
                        "1: a v1 session, greedy (temperature 0) requests only")
    p.add_argument("--slots", type=int, metavar="N", help="concurrent requests (default 4)")
    p.add_argument("--depth", type=int, metavar="D", help="fixed draft depth (default 5)")
    p.add_argument("--top-k", type=int, metavar="K",
                   help="default proposal support: sparse top-k, 0 = dense (default 32)")
    p.add_argument("--watchdog-ms", type=int, metavar="MS",
                   help="deadline for a STEP's validated COMPLETION (default 2000)")
    p.add_argument("--reconnect-max-s", type=float, metavar="S",
                   help="longest backoff between reconnection attempts (default 5)")
    p.add_argument("--target-delay-ms", type=float, metavar="MS",
                   help="simulated forward-pass latency of the embedded toy target per call "
                        "(default 0; the demo uses it to model a large target)")
    add_rank_arguments(p)


def add_rank_arguments(p) -> None:
    """--ranks N: verifier ranks joined with torch.distributed (docs/operations.md)."""
    p.add_argument("--ranks", type=int, metavar="N",
                   help="verifier ranks in the group (default 1: one process). Without "
                        "--rank this process is rank 0 and starts ranks 1..N-1 itself")
    p.add_argument("--rank", type=int, metavar="R",
                   help="this process's rank, each rank started on its own (several "
                        "machines, systemd); under torchrun its environment says it")
    p.add_argument("--rank-master", type=hostport, metavar="HOST:PORT",
                   help="rendezvous store, hosted by rank 0 (default 127.0.0.1:0: any free "
                        "port, for spawned ranks only)")
    p.add_argument("--rank-backend", choices=["auto", "gloo", "nccl"],
                   help="torch.distributed backend (default auto: NCCL with a GPU per "
                        "local rank, else gloo)")
    p.add_argument("--rank-timeout-s", type=float, metavar="S",
                   help="a collective not completed by every rank within S loses the group "
                        "(a dead or hung rank; default 5)")
    p.add_argument("--rank-join-timeout-s", type=float, metavar="S",
                   help="how long ranks wait for each other at start-up (default 120)")
    p.add_argument("--rank-exit-grace-s", type=float, metavar="S",
                   help="after losing the group, answer 503 this long, then exit with "
                        "status 3 (default 2)")


def run(args) -> int:
    from pp1q.cli._daemon import run_daemon
    from pp1q.verifier.daemon import serve

    return run_daemon(args, "verifier", SETTINGS, serve)
