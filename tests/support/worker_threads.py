"""The OpenMP threads of a pytest-xdist worker (tests/conftest.py calls it first)."""

from __future__ import annotations

import os


def threads_per_worker() -> None:
    """Each xdist worker's share of the cores as its OpenMP threads (torch's intra-op pool,
    and every daemon it starts: daemon_env passes the environment on), set before torch is
    imported, unless the caller chose. torch's default is every core in each worker: two
    workers on 2 cores ran 4 threads whose spin-waits took the cores from each other
    (tests/models with -n 2: 324 s, 8.0 CPU minutes; one thread each: 199 s, 4.2). A run
    without xdist keeps torch's default. The cores are those this process may run on (a
    container's cpuset), not the host's: os.cpu_count() counts the host's."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // workers)))
