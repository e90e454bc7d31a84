"""``pp1q worker``: the drafter worker daemon (serves wire v1 and/or v2, revision 3, as
--speculation allows)."""

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

from pp1q.runtime import tls
from pp1q.runtime.config import add_config_option, add_setting

HELP = "run the drafter worker daemon (drafts tokens and ships the exact q of each)"


def add_arguments(p) -> None:
    """Options of pp1q.runtime.settings.WorkerSettings (defaults and ranges live there)."""
    add_setting(p, "worker", "listen", "HOST:PORT", "address to serve verifiers on")
    add_common_arguments(p, "worker")
    tls.add_arguments(p, "worker")
    add_setting(p, "worker", "draft_preset", "NAME",
                "toy drafter's distance from the target: matched, close, far, independent, "
                "adversarial")
    add_setting(p, "worker", "draft_distance", "D",
                "override the preset's distance, 0 (matched) .. 1 (independent)")
    add_setting(p, "worker", "max_support", "K",
                "largest sparse top-k support offered at HELLO")
    add_setting(p, "worker", "check_outgoing", help=(
        "validate every REPLY row and PROPOSAL before it leaves, as the verifier does "
        "again on arrival (off by default: a worker bug then fails on the verifier, "
        "counted there; on, it fails here, named in drafting_aborts; costs one row "
        "validation per row)"))
    add_setting(p, "worker", "max_connections", "N",
                "connections held at once; a new one replaces the oldest without HELLO")
    add_setting(p, "worker", "max_sessions", "N",
                "verifier sessions held at once (below max_connections)")
    add_setting(p, "worker", "max_pending_sessions", "N",
                "sessions that sent no STEP yet; a new HELLO evicts the oldest")
    add_setting(p, "worker", "hello_timeout_s", "S",
                "a connection without HELLO after S seconds is closed")
    add_setting(p, "worker", "idle_timeout_s", "S",
                "a session that sent no STEP yet, silent for S seconds, is closed")
    add_setting(p, "worker", "draft_kv_budget_bytes", "BYTES",
                "a real drafter's K/V for all its requests; past it the least recently used "
                "are dropped (counted) and prefilled again by their next STEP")


def add_common_arguments(p, role: str) -> None:
    """Options both daemons share (model identity, metrics, config, logging)."""
    add_setting(p, role, "metrics_port", "PORT",
                "serve Prometheus /metrics on this port (0: any free port; unset: not served)")
    add_setting(p, role, "metrics_host", "HOST", "metrics bind address")
    add_setting(p, role, "model", "toy|embedded|PATH",
                "what to serve: the toy pair, the shipped SmolLM2-135M, or a local checkpoint")
    add_setting(p, role, "draft", "early-exit:K",
                "real models: draft with the first K layers of --model (both daemons)")
    add_setting(p, role, "draft_adapter", "auto|none|FILE",
                "real models: an exit adapter before the early exit's norm (auto: the "
                "shipped one for this model and K, if any; both daemons)")
    add_setting(p, role, "draft_model", "PATH",
                "real models: draft with a second checkpoint instead (both daemons)")
    add_setting(p, role, "device", "DEVICE", "real models: torch device (cpu, cuda, ...)")
    add_setting(p, role, "dtype", "DTYPE", "real models: float32 or bfloat16")
    add_setting(p, role, "gguf_cache", "DIR",
                "real models: keep GGUF checkpoints de-quantized here")
    add_setting(p, role, "vocab", "N", "toy model vocabulary")
    add_setting(p, role, "model_seed", "S", "toy model seed; worker and verifier must agree")
    add_setting(p, role, "log_level", "LEVEL", "debug, info, warning or error")
    add_setting(p, role, "speculation", "{off,greedy,sampled}",
                "sampled runs only when both daemons name it; off: target-only")
    add_setting(p, role, "capture", "FILE",
                "record every frame in and out of the wire connection to FILE, "
                "for `pp1q replay` (docs/capture.md; unset: no capture)")
    add_setting(p, role, "capture_max_bytes", "BYTES",
                "stop recording once the capture file would pass BYTES (unset: no cap)")
    add_config_option(p)


def run(args) -> int:
    from pp1q.cli._daemon import run_daemon
    from pp1q.worker.daemon import serve

    return run_daemon(args, "worker", serve)
