"""``pp1q demo`` end to end on a small vocabulary: speed, the accepted length against
theory with both noises, and the exactness check of one context."""

import re
import subprocess

import pytest

from pp1q.runtime.launcher import daemon_env, pp1q_command

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers


def test_demo_shows_speed_acceptance_and_exactness():
    proc = subprocess.run(pp1q_command("demo", "--vocab", "64", "--requests", "4",
                                       "--max-tokens", "8", "--target-delay-ms", "0",
                                       "--exactness-samples", "200"),
                          capture_output=True, text=True, timeout=300, env=daemon_env())
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"measured \d+\.\d\d \+- \d+\.\d\d .* expected \d+\.\d\d \+- ", out)
    assert "(both noises)" in out
    m = re.search(r"chi-square ([\d.]+) on (\d+) degrees of freedom, p = ([\d.]+)", out)
    assert m and int(m.group(2)) >= 1 and 0.0 <= float(m.group(3)) <= 1.0
    assert re.search(r"^\s+\d+\s+#+\s+[\d.]+%\s+#*\s+[\d.]+%$", out, re.M)  # a bar row
