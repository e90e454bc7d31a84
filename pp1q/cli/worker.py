"""``pp1q worker``: the drafter worker daemon (wire v2 server)."""

from __future__ import annotations

import argparse
import os

# One BLAS thread per daemon: its products are small, and OpenBLAS's spinning worker
# threads otherwise steal the peer daemon's cores (7x slower rows on a 2-core machine).
# Effective because this module is imported before numpy when the daemon starts.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pp1q.runtime import tls
from pp1q.runtime.config import add_config_option, hostport

HELP = "run the drafter worker daemon (drafts tokens and ships the exact q of each)"

SETTINGS = {  # key: (type, default); also the TOML keys
    "listen": (str, "127.0.0.1:7070"),
    "metrics_host": (str, "127.0.0.1"),
    "metrics_port": (int, None),
    "vocab": (int, 129280),
    "model_seed": (int, 0),
    "draft_preset": (str, "close"),
    "draft_distance": (float, None),
    "wire_versions": (str, "2,1"),
    "max_support": (int, 256),
    "check_outgoing": (bool, True),
    "capture": (str, None),
    "log_level": (str, "info"),
    **tls.SETTINGS,  # mutual TLS with the verifier (off unless all three files are set)
}


def add_arguments(p) -> None:
    from pp1q.models.toy import DRAFT_PRESETS

    p.add_argument("--listen", type=hostport, metavar="HOST:PORT",
                   help="address to serve verifiers on (default 127.0.0.1:7070)")
    add_common_arguments(p)
    tls.add_arguments(p)
    p.add_argument("--draft-preset", choices=sorted(DRAFT_PRESETS),
                   help="toy drafter's distance from the target (default close)")
    p.add_argument("--draft-distance", type=float, metavar="D",
                   help="override the preset's distance, 0 (matched) .. 1 (independent)")
    p.add_argument("--wire-versions", metavar="LIST",
                   help="wire versions this worker accepts, e.g. 2,1 (default) or 1")
    p.add_argument("--max-support", type=int, metavar="K",
                   help="largest sparse top-k support offered at HELLO (default 256)")
    p.add_argument("--check-outgoing", action=argparse.BooleanOptionalAction, default=None,
                   help="validate every REPLY row before it leaves, as the verifier will "
                        "(default on; costs one dense-row validation per dense row)")


def add_common_arguments(p) -> None:
    """Options both daemons share (model identity, metrics, config, logging)."""
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve Prometheus /metrics on this port (0: any free port; "
                        "default: not served)")
    p.add_argument("--metrics-host", metavar="HOST", help="metrics bind address (127.0.0.1)")
    p.add_argument("--vocab", type=int, metavar="N", help="toy model vocabulary (129280)")
    p.add_argument("--model-seed", type=int, metavar="S",
                   help="toy model seed; worker and verifier must agree (default 0)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--capture", metavar="FILE",
                   help="record every frame in and out (wire and context channel) to FILE, "
                        "for `pp1q replay` (docs/capture.md; default: no capture)")
    add_config_option(p)


def run(args) -> int:
    from pp1q.cli._daemon import run_daemon
    from pp1q.worker.daemon import serve

    return run_daemon(args, "worker", SETTINGS, serve)
