"""The work behind ``pp1q chaos proxy`` and ``pp1q chaos matrix`` (pp1q/cli/chaos.py)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import tempfile
import threading
from pathlib import Path

from pp1q.core.errors import ConfigError
from pp1q.runtime.settings import parse_hostport
from pp1q.tools.chaos.faults import Direction
from pp1q.tools.chaos.proxy import FaultProxy
from pp1q.tools.chaos.spec import parse_rule

STREAM_COMMANDS = ("pause", "unpause", "blackhole", "unblackhole")
HELP_LINE = ("commands on stdin: pause|unpause|blackhole|unblackhole to_verifier|to_worker, "
             "reset, stats, quit")


def run_proxy(args) -> int:
    try:
        host, port = parse_hostport(args.listen, "--listen")
        up_host, up_port = parse_hostport(args.upstream, "--upstream")
        rng = random.Random(args.seed)
        rules = [parse_rule(s, rng) for s in args.fault]
    except (ConfigError, ValueError) as e:
        print(f"pp1q chaos proxy: {e}", file=sys.stderr)
        return 2
    return asyncio.run(_serve_proxy(host, port, up_host, up_port, rules))


async def _serve_proxy(host, port, up_host, up_port, rules) -> int:
    proxy = FaultProxy(up_host, up_port)
    proxy.rules = rules
    bound = await proxy.start(host, port)
    rules_said = f"{len(rules)} rule" + ("" if len(rules) == 1 else "s")
    print(f"pp1q chaos proxy on {host}:{bound} -> {up_host}:{up_port}, {rules_said}; "
          f"{HELP_LINE}", flush=True)
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def command(line: str) -> None:
        words = line.split()
        if not words:
            return
        if words[0] == "quit":
            done.done() or done.set_result(None)
        elif words[0] == "reset":
            print(f"reset {proxy.reset_all()} connections", flush=True)
        elif words[0] == "stats":
            print(_stats(proxy), flush=True)
        elif words[0] in STREAM_COMMANDS and len(words) == 2 and words[1] in set(Direction):
            getattr(proxy, words[0])(Direction(words[1]))
        else:
            print(f"? {line.strip()!r}; {HELP_LINE}", flush=True)

    def read_stdin() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(command, line)
        loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

    threading.Thread(target=read_stdin, daemon=True).start()
    try:
        await done
    finally:
        await proxy.stop()
        print(_stats(proxy), flush=True)
    return 0


def _stats(proxy: FaultProxy) -> str:
    inj = ", ".join(f"{k} {v}" for k, v in sorted(proxy.injections.items())) or "none"
    fired = "; ".join(f"rule {i + 1}: {r.fired}/{r.matched} matches fired"
                      for i, r in enumerate(proxy.rules))
    return f"wire connections {proxy.connections}; injected: {inj}" + \
        (f"; {fired}" if fired else "")


def checkout_judge():
    """The tests' goodness-of-fit judge (tests/support/stats.py, exact marginals of the daemon
    distribution test), when running from a source checkout; else None."""
    tests = Path(__file__).resolve().parents[3] / "tests"
    if not (tests / "support" / "stats.py").exists():
        return None
    sys.path.insert(0, str(tests / "support"))
    try:
        from daemon_distribution import exact_marginals, worst_position
    except ImportError:
        return None

    def judge(counts):
        worst, _ = worst_position(counts, exact_marginals())
        return not worst.rejected, f"worst position: {worst}"
    return judge


def run_matrix(args) -> int:
    from pp1q.tools.chaos.distribution import (
        SPARSE_DIST_TOP_K,
        format_distribution,
        run_distribution,
    )
    from pp1q.tools.chaos.matrix import ROW_REQUESTS, WATCHDOG_MS, cases, format_table, run_case
    from pp1q.tools.chaos.rank_row import run_rank_crash
    from pp1q.tools.chaos.rig import Rig
    from pp1q.tools.chaos.sparse_rows import SPARSE_TOP_K, SPARSE_VOCAB, sparse_cases, sparse_rig

    watchdog_ms = WATCHDOG_MS
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="pp1q-chaos-")
    judge = checkout_judge()
    n_dist = args.distribution if args.distribution is not None else 2000
    requests = args.requests or ROW_REQUESTS
    print(f"pp1q chaos matrix: vocab 16, far drafter, watchdog {watchdog_ms} ms, "
          f"{requests} requests per row (sparse rows: vocab {SPARSE_VOCAB}, top-{SPARSE_TOP_K} "
          f"PROPOSALs), {n_dist} in each distribution row (dense q, top-{SPARSE_DIST_TOP_K} q); "
          f"logs in {log_dir}", flush=True)
    rows, dists = [], []

    def run_rows(rig, row_cases) -> None:
        for case in row_cases:
            rows.append(run_case(rig, case, requests=requests))
            print(f"  {rows[-1].name}: {'ok' if rows[-1].ok else 'FAIL'}", flush=True)

    rig = Rig(log_dir, vocab=16, preset="far", watchdog_ms=watchdog_ms)
    try:
        run_rows(rig, cases(watchdog_ms / 1000))
        sparse = sparse_rig(Path(log_dir) / "sparse")
        try:
            run_rows(sparse, sparse_cases(watchdog_ms / 1000))
        finally:
            with contextlib.suppress(Exception):
                sparse.close()
        rows.append(run_rank_crash(Path(log_dir) / "ranks"))
        print(f"  {rows[-1].name}: {'ok' if rows[-1].ok else 'FAIL'}", flush=True)
        if n_dist:
            for top_k in (None, SPARSE_DIST_TOP_K):
                dists.append(run_distribution(rig, n_dist, judge, top_k=top_k,
                                              watchdog_s=watchdog_ms / 1000))
    finally:
        with contextlib.suppress(Exception):
            rig.close()
    print(format_table(rows))
    for dist in dists:
        print(format_distribution(dist))
    if dists and judge is None:
        print("(distribution not judged: tests/support/stats.py not found; run from a checkout)")
    failed = [r for r in rows if r.problems] or any(not d.ok for d in dists)
    return 1 if failed else 0
