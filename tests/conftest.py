import os
from pathlib import Path

import pytest
from collection import deselects_every_test


def _threads_per_worker() -> None:
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


_threads_per_worker()


def pytest_addoption(parser):
    parser.addoption(
        "--runslow", action="store_true", default=False,
        help="run the long statistical/soak variants (bounded variants always run)",
    )


def pytest_ignore_collect(collection_path: Path, config):
    """Under ``-m``, a module whose own marks deselect every test it could hold is not
    imported at all (tests/support/collection.py): the inner loop's collection skips the
    daemon, model and experiment modules and their imports (openai, transformers)."""
    markexpr = config.option.markexpr
    if markexpr and collection_path.suffix == ".py" and collection_path.name.startswith("test_") \
            and deselects_every_test(collection_path, markexpr):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="long variant: pass --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def daemon_zygote(tmp_path_factory):
    """pp1q daemons started through pp1q.runtime.launcher fork from one preloaded process
    (tests/support/zygote.py: ~0.1 s of CPU each instead of ~2.6 s) unless
    PP1Q_TEST_ZYGOTE=0; the zygote itself starts with the first such daemon."""
    if os.environ.get("PP1Q_TEST_ZYGOTE", "1") == "0":
        yield None
        return
    from zygote import Zygote

    from pp1q.core.backend_choice import prefer_wide_vectors
    from pp1q.runtime import launcher

    # the first numba backend choice in this process sets NUMBA_CPU_FEATURES; set it now,
    # before the zygote's environment is taken, or every daemon started after that choice
    # differs from the zygote in a NUMBA_ variable and is exec'd instead of forked
    prefer_wide_vectors()
    zygote = Zygote(str(tmp_path_factory.mktemp("zygote")), launcher.daemon_env())
    saved, launcher.subprocess = launcher.subprocess, zygote.subprocess_module()
    try:
        yield zygote
    finally:
        launcher.subprocess = saved
        zygote.close()
