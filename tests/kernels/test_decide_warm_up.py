"""The verifier's warm-up (``numba_rows.warm_up``, run before it serves) loads every
decision kernel a round calls with the argument kinds the rows a worker sends bring, so
no round specializes one: a specialization is compiled (or read from numba's disk cache)
on the serving event loop. ``pick`` with a received sparse row's ids (read-only: parsed
in place from the frame) was missing: the first rejected sparse round compiled it, ~4 s
of CPU and ~95 MiB with every request and the watchdog stalled where the daemon had
loaded its kernels from numba's cache (any start after the first). Under two CPU hogs
test_soak_leave's first requests took 9-10 s (its bound: 10 s) and the verifier's RSS
grew 95 MiB after the warm-up (the soak's bound: 32 MiB).

Checked in a fresh interpreter: a test process has specialized kernels of its own."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba not installed (the fast extra)")

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 300.0  # kernels loaded from numba's cache take seconds; compiled, a minute

# after the warm-up, rounds of received rows (sparse and dense, both p dtypes, accepted
# and rejected), then target-only picks: the signatures each kernel gained (none: {})
PROBE = r"""
import json
import numpy as np
from pp1q.core.q import dense_row_of_valid, parse_sparse
from pp1q_kernels import numba_draws, numba_rows, numba_step

numba_rows.warm_up()
kernels = {f"{m.__name__}.{n}": d for m in (numba_step, numba_draws)
           for n, d in vars(m).items() if hasattr(d, "signatures")}
before = {n: len(d.signatures) for n, d in kernels.items()}
k = numba_rows.chosen()[2]
ids = np.array([0, 2], "<i4").tobytes()  # a frame's bytes: the rows are read in place
q = np.array([0.5, 0.5], "<f4").tobytes()
dense = np.frombuffer(np.array([0.5, 0.0, 0.5], "<f4").tobytes(), np.float32)
rows = (parse_sparse(ids, q, 3), dense_row_of_valid(dense, 3))
one = np.ones(1, np.int64)
for dtype in (np.float64, np.float32):
    p = np.array([[0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]], dtype)
    for row in rows:
        for u_acc in (one, one << 52):  # accepted, rejected (the residual pick)
            numba_rows.decide_rows(k, [p], (one << 23)[None], [[row]],
                                   np.zeros((1, 1), np.int64), u_acc[None], one[None], one)
    numba_rows.target_pick(k, p[0], 1)
print(json.dumps({n: len(d.signatures) - before[n] for n, d in kernels.items()
                  if len(d.signatures) != before[n]}))
"""


def test_rounds_of_received_rows_specialize_no_kernel_after_the_warm_up():
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True,
                       text=True, timeout=RUN_TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-4000:]
    assert json.loads(r.stdout.splitlines()[-1]) == {}
