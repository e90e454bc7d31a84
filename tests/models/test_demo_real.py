"""``pp1q demo`` on the embedded SmolLM2-135M (its default) end to end, bounded: a few
tokens per request, the model cache filled beforehand (``cache_home``, conftest)."""

from __future__ import annotations

import re

import pytest
from real_model import run_pp1q

pytestmark = [pytest.mark.model, pytest.mark.daemons]


def test_real_demo_shows_prompts_text_acceptance_speed_and_exactness(cache_home):
    proc = run_pp1q(cache_home, "demo", "--requests", "2", "--max-tokens", "4",
                    "--exactness-samples", "12")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "first run" not in out  # the cache was used
    assert out.count("\nprompt ") == 2
    for label in ("speculative", "target-only"):
        assert re.search(rf"^  {label}: \S", out, re.M)  # generated text, each way
    assert re.search(r"\d+ of \d+ drafts accepted, \d+\.\d\d per round", out)
    assert re.search(r"speculative / target-only = \d+\.\d\d", out)
    assert re.search(r"accepted drafts per round: \d+\.\d\d .* 0\.\.5: \[(\d+, ){5}\d+\]", out)
    assert re.search(r"^  fallback(s: none| \w+ x\d+: )", out, re.M)
    m = re.search(r"chi-square ([\d.]+) on (\d+) degrees of freedom, p = ([\d.]+|nan)", out)
    assert m, out
