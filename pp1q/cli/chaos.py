"""``pp1q chaos``: the fault-injection proxy for manual runs, and the chaos matrix."""

from __future__ import annotations

HELP = "fault-injection proxy between verifier and worker (proxy), or the chaos matrix (matrix)"


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="chaos_command", metavar="ACTION")
    px = sub.add_parser("proxy", help="run the proxy: verifier -> LISTEN -> UPSTREAM (worker)")
    px.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                    help="where the verifier connects (default 127.0.0.1, a free port)")
    px.add_argument("--upstream", required=True, metavar="HOST:PORT", help="the worker")
    px.add_argument("--fault", action="append", default=[], metavar="SPEC",
                    help="a frame fault, e.g. drop:reply:index=2:every=10 (repeatable); "
                         "see docs in RELIABILITY.md")
    px.add_argument("--seed", type=int, default=1, help="seed of random (p=) faults")
    mx = sub.add_parser("matrix", help="run the chaos matrix against real daemons, print it")
    mx.add_argument("--requests", type=int, default=None,
                    help="requests per fault row (default: the bounded CI size)")
    mx.add_argument("--distribution", type=int, default=None, metavar="N",
                    help="requests of each mixed-fault distribution check, dense q and "
                         "top-3 q (default: CI size; 0: none)")
    mx.add_argument("--log-dir", default=None, help="daemon logs here (default: a temp dir)")


def run(args) -> int:
    if args.chaos_command == "proxy":
        from pp1q.tools.chaos.cli import run_proxy

        return run_proxy(args)
    if args.chaos_command == "matrix":
        from pp1q.tools.chaos.cli import run_matrix

        return run_matrix(args)
    print("pp1q chaos: choose an action: proxy or matrix")
    return 2
