"""The sharded sampler over real gloo processes: 2 and 3 ranks with uneven shards decide
every round as one rank does, and no collective carries a vocabulary-wide row."""

import json
import os
import sys
from pathlib import Path

import pytest
from rank_harness import free_port
from shard_cases import ONE, SPLITS, D, V, cases, round_keys, round_on

from pp1q.runtime.launcher import run_together

ROUNDS = 60  # the simulated form runs 600 (10^4 with --runslow: test_kernels_shard_step.py)
RUN_S = 240  # bound on one group's run (spawn, join, rounds)
SUPPORT = Path(__file__).resolve().parents[2] / "support"

pytestmark = pytest.mark.daemons  # real processes on loopback


# the device form copies every collective's tensors to a device and back, as the NCCL
# backend does (cuda:LOCAL_RANK): the CPU over gloo here, cuda where scripts/
# device_check.sh sets PP1Q_TEST_DEVICE on a GPU machine
DEVICE = os.environ.get("PP1Q_TEST_DEVICE", "cpu")


@pytest.mark.parametrize("world, device", [(2, "none"), (3, DEVICE)])
def test_gloo_ranks_decide_as_one_rank(tmp_path, world, device):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SUPPORT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    codes = run_together([[sys.executable, str(SUPPORT / "shard_gloo_rank.py"), str(r),
                           str(world), str(port), str(ROUNDS), str(outs[r]), device]
                          for r in range(world)], RUN_S, env)
    assert codes == [0] * world
    runs = [json.loads(o.read_text()) for o in outs]
    pool = cases()
    want = [list(round_on(ONE, pool[k % len(pool)], round_keys(k))) for k in range(ROUNDS)]
    assert all(run["results"] == want for run in runs)
    widest = max(hi - lo for lo, hi in SPLITS[world - 2].bounds)
    assert widest < V
    for run in runs:
        # the sampler's collectives: a few integers per row; the q scatter: D rows of
        # one shard (padded to the widest) per rank
        assert max(n for kind, _, n in run["log"] if kind != "Scatter") <= 2 * (D + 1)
        assert {n for kind, _, n in run["log"] if kind == "Scatter"} == {D * widest}
        assert {kind for kind, _, _ in run["log"]} == {"Gather", "Sum", "Bcast", "Scatter"}
