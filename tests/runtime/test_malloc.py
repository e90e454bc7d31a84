"""A daemon sets glibc's malloc thresholds itself (pp1q.runtime.malloc): a dense row's
temporaries then come from the heap, not from fresh mmaps that page-fault on every row.
Page faults are counted by the kernel (getrusage), not timed."""

import os
import subprocess
import sys

import pytest

from pp1q.runtime import malloc

# build_row of a flat 129280-entry row, 20 times after a warm-up: minor faults per row
_PROBE = """
import resource, sys
import numpy as np
from pp1q.runtime import malloc
if sys.argv[1] == "tune":
    assert malloc.tune() == list(malloc.ENV)
from pp1q.core.q import build_row
x = np.random.default_rng(0).normal(size=129280) * 0.01
build_row(x)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    build_row(x)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _faults_per_row(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in malloc.ENV}
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuned_thresholds_stop_the_page_faults_of_every_dense_row() -> None:
    plain, tuned = _faults_per_row("plain"), _faults_per_row("tune")
    # untuned: a 517 KB - 1 MB temporary is 126-253 pages faulted afresh; tuned: reused
    assert plain > 100
    assert tuned < plain / 10


def test_an_operators_own_setting_wins() -> None:
    assert malloc.tune({name: "1" for name in malloc.ENV}) == []
    assert malloc.tune({"MALLOC_MMAP_THRESHOLD_": "1"}) == ["MALLOC_TRIM_THRESHOLD_"]
