"""``pp1q bench model``'s plumbing, bounded: one early-exit depth, one temperature, six
tokens (the model cache filled beforehand: ``cache_home``, conftest)."""

from __future__ import annotations

import re

import pytest
from real_model import run_pp1q

# slow: two real-model daemons for one configuration (about 40 s); start_pair with
# real-model options also runs in the demo's model test, the pinning only here
pytestmark = [pytest.mark.model, pytest.mark.daemons, pytest.mark.slow]


def test_bench_model_plumbing_with_the_drafter_equal_to_the_target(cache_home):
    # early exit at all 30 layers: q = p up to float noise, so nearly every draft passes
    proc = run_pp1q(cache_home, "bench", "model", "--quick", "--k", "30",
                    "--temperatures", "1.0", "--tokens", "6")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"pinned to core|note: ", out)
    assert "target-only T=1.0: 6 tokens" in out
    assert "k=30: no shipped exit adapter" in out  # auto asked for, none ships for k = 30
    row = re.search(r"^\| 30 \| none \| 5 \| 1\.0 \| ([\d.]+)% \| ([\d.]+)% \| ([\d.]+) \| "
                    r"([\d.]+) \|", out, re.M)
    assert row, out
    per_position, of_drafted = float(row.group(1)), float(row.group(2))
    assert per_position >= 90.0 and of_drafted >= 50.0, row.group(0)
    assert float(row.group(4)) > 1.0  # tokens per target forward: drafts were committed
    assert re.search(r"best drafter: k=30 none D=5 at T=1\.0: x[\d.]+ fewer verifier-seconds",
                     out)
