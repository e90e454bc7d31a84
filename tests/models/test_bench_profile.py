"""``pp1q bench profile``'s round: the production pieces in process, every stage timed.

Speed is not asserted (benchmarks measure it); what is checked is that the profiled
round is a real round: it validates, decides and commits on both ends, every stage is
reported, and each probe counted the calls it stands for (an unwired one counts none)."""

from __future__ import annotations

import re

import pytest
from real_model import run_pp1q

from pp1q.wire import verifier_endpoint

pytestmark = pytest.mark.model


@pytest.mark.parametrize("case", [("dense", None, 1.0, None), ("sparse", 32, 0.7, 0.9)])
def test_profiled_rounds_commit_on_both_ends(smol, case):
    from pp1q.models.hf_drafter import HFDrafter
    from pp1q.models.hf_target import HFTarget
    from pp1q.models.text import TextCodec
    from pp1q.tools.bench import profile

    prompt = TextCodec(smol.tokenizer).encode(profile.PROMPT, chat=True)
    target = HFTarget.from_checkpoint(smol)
    drafter = HFDrafter.early_exit(smol, 30)  # the target itself: drafts are accepted
    original = verifier_endpoint.check_reply, verifier_endpoint.check_proposal
    with profile.probes(target) as clocks:
        pair = profile.open_pair(smol, drafter, target, prompt, case)
        accepted = []
        for _ in range(2):
            calls = {name: c.calls for name, c in clocks.items()}
            t, a = profile.one_round(pair, clocks)
            accepted.append(a)
            assert set(t) == set(profile.STAGES)
            # as the daemons frame it: a dense step a REPLY a row, a sparse one a PROPOSAL
            dense = case[0] == "dense"
            assert clocks["check"].calls - calls["check"] == (profile.DEPTH if dense else 0)
            assert clocks["check_proposal"].calls - calls["check_proposal"] == (not dense)
            assert clocks["forward"].calls - calls["forward"] == 1  # one target forward
        assert pair.worker.context(0) == pair.prefix.tokens  # COMMIT reached the worker
        assert len(pair.prefix.tokens) == len(prompt) + sum(accepted) + 2
        ledger, _ = target._get(0)
        assert ledger.committed == pair.prefix.tokens  # the target committed the same
    assert (verifier_endpoint.check_reply, verifier_endpoint.check_proposal) == original
    assert "forward" not in vars(target.lm)  # the probe is gone
    assert sum(accepted) >= 6  # drafter = target: nearly every draft accepted


def test_every_clock_read_waits_for_the_device_first(smol, monkeypatch):
    """On a GPU a stage returns before its kernels finish: a clock read that does not
    wait for the device charges that stage's work to the next one. On the CPU the wait is
    a no-op, so here each wait is recorded instead, and every clock read of the round
    (its stages, the target-only step, the probes) must come right after one."""
    from types import SimpleNamespace

    from pp1q.models.hf_drafter import HFDrafter
    from pp1q.models.hf_target import HFTarget
    from pp1q.models.text import TextCodec
    from pp1q.tools.bench import profile

    events: list[str] = []
    monkeypatch.setattr(profile, "time", SimpleNamespace(
        perf_counter=lambda: events.append("clock") or float(len(events))))

    def wait() -> None:
        events.append("wait")

    prompt = TextCodec(smol.tokenizer).encode(profile.PROMPT, chat=True)
    target = HFTarget.from_checkpoint(smol)
    assert profile.device_clock(target.device) is profile.device_clock("cpu")
    with profile.probes(target) as clocks:
        for clock in clocks.values():
            clock.sync = wait
        pair = profile.open_pair(smol, HFDrafter.early_exit(smol, 8), target, prompt,
                                 profile.CASES[2])
        pair.sync = wait
        profile.one_round(pair, clocks)
        profile._target_only(pair, clocks)
    reads = [i for i, e in enumerate(events) if e == "clock"]
    assert len(reads) >= 2 * len(profile.STAGES)  # a start and an end a stage at least
    assert all(i > 0 and events[i - 1] == "wait" for i in reads), events


@pytest.mark.slow  # about 30 s: four cases x 5 rounds of the real model
def test_bench_profile_command_prints_every_case(cache_home):
    from pp1q.tools.bench import profile

    proc = run_pp1q(cache_home, "bench", "profile", "--quick")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"pinned to core \d+, torch threads 1|not pinned", out), out
    rows = re.findall(r"^\| (dense|sparse k=32) T=[\d.]+.*\| ([\d.]+)% \| [\d,]+ \|$", out, re.M)
    assert len(rows) == len(profile.CASES), out
    assert "goal: non-forward <= 10% of the round's forward" in out
    assert len(re.findall(r"x a target-only step", out)) == len(profile.CASES), out
