"""Normal concurrent load (more requests than slots, sampled and greedy) leaves no
WARNING or ERROR line in either daemon's log and no fallback: a warning then always
means something an operator should look at. (Issue 16 saw `commit not applied:
stale_generation` warnings under normal load; they came from the worker's context
state of the old context channel, deleted with wire revision 2; this keeps it so.)"""

from __future__ import annotations

import pytest
from daemon_harness import Pair, value

pytestmark = pytest.mark.daemons


def test_normal_load_logs_no_warning_and_falls_back_nowhere(tmp_path):
    pair = Pair(tmp_path, vocab=64)
    try:
        bodies = [{"prompt": [1 + i % 50, 2], "max_tokens": 24, "seed": i} for i in range(24)]
        bodies += [{"prompt": [3, 4], "max_tokens": 16, "seed": 100 + i, "temperature": 0}
                   for i in range(8)]
        answers = pair.generate_many(bodies, concurrency=8)  # 4 slots: some queue
        assert len(answers) == len(bodies)
        v = pair.metrics("verifier")
        assert sum(val for (name, _labels), val in v.items()
                   if name == "pp1q_fallbacks_total") == 0
        assert value(v, "pp1q_rounds_total", kind="speculative") > 0
    finally:
        pair.close()
    for log in sorted(tmp_path.glob("*.log")):
        noisy = [line for line in log.read_text().splitlines()
                 if " WARNING " in line or " ERROR " in line]
        assert not noisy, (log.name, noisy[:5])
