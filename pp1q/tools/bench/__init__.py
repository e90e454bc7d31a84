"""Benchmark suites behind ``pp1q bench``. Speed lives here, never in tests.

Each suite module defines ``TITLE`` and ``run(quick: bool) -> list[str]`` returning the
lines to print (or a generator: each line prints as it comes): ratios measured side by
side in the same run (ours vs the physical limit and vs the peer approach).
"""

import functools

SUITES = {
    "q": "pp1q.tools.bench.q",
    "wire": "pp1q.tools.bench.wire",
    "kernels": "pp1q.tools.bench.kernels",
    "round": "pp1q.tools.bench.round",
    "goals": "pp1q.tools.bench.goals",
    "ranks": "pp1q.tools.bench.ranks",
    "model": "pp1q.tools.bench.model",
    "profile": "pp1q.tools.bench.profile",
    "prefill": "pp1q.tools.bench.prefill",
    "first-round": "pp1q.tools.bench.first_round",
}

# run only when named: they need the real model (model: about 10 minutes; profile: 2;
# prefill: 4; first-round: 5 on a 2-core CPU)
OPT_IN = frozenset({"model", "profile", "prefill", "first-round"})


def bench_device() -> str:
    """Where a suite's tensors and models go: CUDA where there is a GPU, else the CPU
    (scripts/device_check.sh runs the kernels and profile suites on a GPU machine)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def no_wait() -> None:
    """The CPU's wait: its work is done when a call returns."""


def device_clock(device):
    """What waits for ``device`` (a torch.device or its name) before a clock read: a
    no-op on the CPU, else ``torch.cuda.synchronize`` (a GPU runs behind its caller:
    without the wait a clock charges queued work to whatever waits for it next)."""
    if str(device) == "cpu":
        return no_wait
    import torch

    # its own device: a bare synchronize waits on the current one, which need not be it
    return functools.partial(torch.cuda.synchronize, device)
