"""Benchmark suites behind ``pp1q bench``. Speed lives here, never in tests.

Each suite module defines ``TITLE`` and ``run(quick: bool) -> list[str]`` returning the
lines to print (or a generator: each line prints as it comes): ratios measured side by
side in the same run (ours vs the physical limit and vs the peer approach).
"""

SUITES = {
    "q": "pp1q.tools.bench.q",
    "wire": "pp1q.tools.bench.wire",
    "kernels": "pp1q.tools.bench.kernels",
    "round": "pp1q.tools.bench.round",
    "goals": "pp1q.tools.bench.goals",
    "ranks": "pp1q.tools.bench.ranks",
    "model": "pp1q.tools.bench.model",
    "profile": "pp1q.tools.bench.profile",
}

# run only when named: both need the real model (model: about 10 minutes; profile: 2)
OPT_IN = frozenset({"model", "profile"})
