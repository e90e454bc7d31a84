"""tests/conftest.py (tests/support/worker_threads.py) gives each xdist worker its
share of the cores as OpenMP threads (the workers' spinning threads took the cores from
each other), counting the cores this process may run on, and leaves a caller's own
setting and a run without xdist alone."""

from __future__ import annotations

import os

import pytest
from worker_threads import threads_per_worker


@pytest.mark.parametrize(("workers", "cores", "preset", "want"), [
    ("2", 2, None, "1"),  # CI: two workers on two cores, a thread each
    ("2", 8, None, "4"),
    ("4", 2, None, "1"),  # more workers than cores: never 0
    ("2", 8, "3", "3"),  # the caller chose
    ("1", 8, None, None),  # one worker: torch's default
    (None, 8, None, None),  # no xdist
])
def test_each_worker_gets_its_share_of_the_cores_it_may_use(monkeypatch, workers, cores,
                                                            preset, want):
    # a copy of the environment for the test: threads_per_worker sets OMP_NUM_THREADS
    # itself, and monkeypatch restores only what it set (a value left in a -n0 run made
    # every later daemon's OpenMP setting differ from the test zygote's: exec'd, not forked)
    monkeypatch.setattr(os, "environ", os.environ.copy())
    for name, value in (("PYTEST_XDIST_WORKER_COUNT", workers), ("OMP_NUM_THREADS", preset)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    # the affinity mask, not the host's count (a 2-core cpuset of a 64-core host)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    threads_per_worker()
    assert os.environ.get("OMP_NUM_THREADS") == want
