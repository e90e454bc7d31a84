import os
from pathlib import Path

import pytest
from collection import deselects_every_test
from worker_threads import threads_per_worker

threads_per_worker()  # before anything imports torch


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
