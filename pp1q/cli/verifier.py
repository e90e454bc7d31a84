"""``pp1q verifier``: the target-side verifier daemon with its HTTP API."""

from __future__ import annotations

import os

# One BLAS thread per daemon: its products are small, and OpenBLAS's spinning worker
# threads otherwise steal the peer daemon's cores (7x slower rows on a 2-core machine).
# Effective because this module is imported before numpy when the daemon starts.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Torch's OpenMP workers sleep instead of spinning between ops, for the same reason
# (torch ops 5-20x slower under load measured; BENCHMARKS.md, Hot path,
# "Earlier: the first figures and levers").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pp1q.cli.worker import add_common_arguments
from pp1q.runtime import tls
from pp1q.runtime.config import add_setting

HELP = "run the verifier daemon: HTTP API, scheduler, exact verification of worker drafts"


def add_arguments(p) -> None:
    """Options of pp1q.runtime.settings.VerifierSettings (defaults and ranges live there)."""
    v = "verifier"
    add_setting(p, v, "worker", "HOST:PORT", "the drafter worker to connect to")
    add_setting(p, v, "http", "HOST:PORT", "HTTP API address")
    add_common_arguments(p, v)
    tls.add_arguments(p, v)
    add_setting(p, v, "draw_secret_file", "FILE",
                "hex secret keying the verifier's draws (mode 600); none: random per start")
    add_setting(p, v, "slots", "N", "concurrent requests")
    add_setting(p, v, "depth", "D", "fixed draft depth")
    add_setting(p, v, "top_k", "K", "default proposal support: sparse top-k, 0 = dense")
    add_setting(p, v, "watchdog_ms", "MS",
                "deadline for a STEP's validated COMPLETION (or PROPOSAL)")
    add_setting(p, v, "reconnect_max_s", "S", "longest backoff between reconnection attempts")
    add_setting(p, v, "breaker_after_timeouts", "K",
                "consecutive watchdog fallbacks that open the circuit: target-only, no STEP "
                "sent, for breaker-open-s")
    add_setting(p, v, "breaker_open_s", "S",
                "first open period of the circuit; doubles after each probe that times out")
    add_setting(p, v, "breaker_open_max_s", "S", "longest open period of the circuit")
    add_setting(p, v, "drain_timeout_s", "S",
                "on SIGTERM: how long in-flight requests may finish (queued ones get 503)")
    add_setting(p, v, "http_connections_per_address", "N",
                "HTTP connections one client address may hold (0: no such bound, for a "
                "proxy in front)")
    add_setting(p, v, "requests_queued_per_address", "N",
                "requests one client address may have waiting for a slot (0: no such "
                "bound, for a proxy in front)")
    add_setting(p, v, "target_delay_ms", "MS",
                "simulated forward-pass latency of the embedded toy target per call "
                "(the demo uses it to model a large target)")
    add_rank_arguments(p)


def add_rank_arguments(p) -> None:
    """--ranks N: verifier ranks joined with torch.distributed (docs/operations.md)."""
    v = "verifier"
    add_setting(p, v, "ranks", "N",
                "verifier ranks in the group (1: one process). Without --rank this process "
                "is rank 0 and starts ranks 1..N-1 itself")
    add_setting(p, v, "rank", "R",
                "this process's rank, each rank started on its own (several machines, "
                "systemd); under torchrun its environment says it")
    add_setting(p, v, "rank_master", "HOST:PORT",
                "rendezvous store, hosted by rank 0 (port 0: any free port, for spawned "
                "ranks only)")
    add_setting(p, v, "rank_backend", "{auto,gloo,nccl}",
                "torch.distributed backend (auto: NCCL with a GPU per local rank, else gloo)")
    add_setting(p, v, "rank_timeout_s", "S",
                "a collective not completed by every rank within S loses the group (a dead "
                "or hung rank)")
    add_setting(p, v, "rank_join_timeout_s", "S",
                "how long ranks wait for each other at start-up")
    add_setting(p, v, "rank_exit_grace_s", "S",
                "after losing the group, answer 503 this long, then exit with status 3")
    add_setting(p, v, "shard_vocab", None,
                "each rank holds one vocabulary shard of the target (its LM head rows) and "
                "every rank takes part in each exact decision; dense q is scattered by "
                "slices (docs/operations.md)")
    add_setting(p, v, "shard_kv_budget_bytes", "BYTES",
                "with --shard-vocab and a real model: each rank's K/V for all its slots; past "
                "it the least recently used slot caches are dropped (counted) and recomputed")


def run(args) -> int:
    from pp1q.cli._daemon import run_daemon
    from pp1q.verifier.daemon import serve

    return run_daemon(args, "verifier", serve)
