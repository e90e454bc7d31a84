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


@pytest.mark.slow  # 40 s: the group's serving is test_hf_shard_daemons'; this is the demo's wiring
def test_real_demo_on_two_sharded_ranks(cache_home):
    # --ranks 2: the verifier's ranks each hold half the LM head (--shard-vocab)
    proc = run_pp1q(cache_home, "demo", "--ranks", "2", "--requests", "1", "--max-tokens", "3",
                    "--exactness-samples", "6")
    assert proc.returncode == 0, proc.stderr
    assert "verifier: 2 ranks (--shard-vocab)" in proc.stdout
    assert re.search(r"\d+ of \d+ drafts accepted", proc.stdout)
    assert re.search(r"chi-square ([\d.]+|nan) on \d+ degrees of freedom", proc.stdout)


def test_real_demo_refuses_a_rank_count_out_of_range(cache_home):
    proc = run_pp1q(cache_home, "demo", "--ranks", "0")
    assert proc.returncode == 2 and "--ranks must be 1..16" in proc.stderr
