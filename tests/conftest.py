import os

import pytest

# -n auto's workers: one more than the cores, at most 4 (pyproject's --maxprocesses). The
# daemon tests spend much of their time waiting (start-up, watchdogs, a simulated target
# forward), and a third worker on CI's two cores fills those waits: the default run took
# 8 min 56 s with three workers, 10 min 4 s with two and 10 min 24 s with four (one slow
# day, the same clean clone).
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    return min((os.cpu_count() or 1) + 1, MAX_WORKERS)


def pytest_addoption(parser):
    parser.addoption(
        "--runslow", action="store_true", default=False,
        help="run the long statistical/soak variants (bounded variants always run)",
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="long variant: pass --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
