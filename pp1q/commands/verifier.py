"""``pp1q verifier``: the target-side verifier daemon with its HTTP API."""

from __future__ import annotations

import os

# One BLAS thread per daemon: its products are small, and OpenBLAS's spinning worker
# threads otherwise steal the peer daemon's cores (7x slower rows on a 2-core machine).
# Effective because this module is imported before numpy when the daemon starts.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pp1q import tls
from pp1q.commands.worker import add_common_arguments
from pp1q.config import hostport

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


def run(args) -> int:
    from pp1q.commands._daemon import run_daemon
    from pp1q.verifier.daemon import serve

    return run_daemon(args, "verifier", SETTINGS, serve)
