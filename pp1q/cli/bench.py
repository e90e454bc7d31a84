"""``pp1q bench``: run benchmark suites and print side-by-side ratios."""

from __future__ import annotations

import importlib
import os
import platform
import time

# As the daemons run (pp1q.cli.verifier): torch's OpenMP workers sleep between ops, so
# in-process measurements are of what the service runs. Set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HELP = "run benchmarks (ratios measured side by side in one run); see BENCHMARKS.md"


def add_arguments(p) -> None:
    from pp1q.tools.bench import SUITES

    p.add_argument("suites", nargs="*", metavar="SUITE",
                   help=f"suites to run (default: all of {', '.join(SUITES)})")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")


def run(args) -> int:
    from pp1q.tools.bench import SUITES

    names = args.suites or list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"unknown suite(s): {', '.join(unknown)}; known: {', '.join(SUITES)}")
        return 2
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
        for line in mod.run(quick=args.quick):
            print(line, flush=True)
        print(f"({name}: {time.perf_counter() - t0:.1f} s)")
    return 0
