"""``pp1q bench``: run benchmark suites and print side-by-side ratios."""

from __future__ import annotations

import importlib
import inspect
import os
import platform
import sys
import time

# As the daemons run (pp1q.cli.verifier): torch's OpenMP workers sleep between ops, so
# in-process measurements are of what the service runs. Set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HELP = "run benchmarks (ratios measured side by side in one run); see BENCHMARKS.md"


def add_arguments(p) -> None:
    from pp1q.tools.bench import OPT_IN, SUITES

    p.add_argument("suites", nargs="*", metavar="SUITE",
                   help=f"suites to run (default: {', '.join(n for n in SUITES if n not in OPT_IN)}"
                        f"; {', '.join(sorted(OPT_IN))} only when named)")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    p.add_argument("--k", type=_ints, metavar="K,K,...",
                   help="model suite: early-exit depths (default 8,16,24,28)")
    p.add_argument("--temperatures", type=_floats, metavar="T,T,...",
                   help="model suite: target temperatures (default 0.7,1.0)")
    p.add_argument("--tokens", type=int, metavar="N",
                   help="model suite: tokens per request (default 24; --quick 8)")
    p.add_argument("--adapters", type=_words, metavar="A,A,...",
                   help="model suite: exit adapters, none and/or auto (default none,auto)")
    p.add_argument("--depths", type=_ints, metavar="D,D,...",
                   help="model suite: drafts per round (default 5)")
    p.add_argument("--model", metavar="embedded|PATH",
                   help="ranks suite: a real model on vocabulary-sharded ranks (1 and 2) "
                        "instead of the toy")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _words(text: str) -> list[str]:
    import argparse

    words = [x for x in text.split(",") if x]
    if any(w not in ("none", "auto") for w in words):
        raise argparse.ArgumentTypeError(f"{text!r}: none and/or auto")
    return words


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def run(args) -> int:
    from pp1q.tools.bench import OPT_IN, SUITES

    names = args.suites or [n for n in SUITES if n not in OPT_IN]
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"unknown suite(s): {', '.join(unknown)}; known: {', '.join(SUITES)}",
              file=sys.stderr)
        return 2
    from pp1q.runtime import malloc

    malloc.tune()  # the daemons' malloc thresholds: in-process figures are the service's
    print(f"pp1q bench on {platform.machine()} / Python {platform.python_version()}")
    for name in names:
        try:
            mod = importlib.import_module(SUITES[name])
        except ModuleNotFoundError as e:
            if e.name != SUITES[name]:
                raise
            print(f"\n== {name}: not built yet")
            continue
        print(f"\n== {mod.TITLE}", flush=True)
        t0 = time.perf_counter()
        # suite options (--k, ...) go to the suites whose run() takes them
        wanted = inspect.signature(mod.run).parameters
        options = {key: getattr(args, key)
                   for key in ("k", "temperatures", "tokens", "adapters", "depths", "model")
                   if key in wanted and getattr(args, key) is not None}
        for line in mod.run(quick=args.quick, **options):
            print(line, flush=True)
        print(f"({name}: {time.perf_counter() - t0:.1f} s)")
    return 0
