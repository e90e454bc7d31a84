"""The service's Decider qualified against the rational oracle (pp1q.core.reference).

What the daemon runs by default (pp1q.verifier.daemon.STANDARD: KernelDecider) decides
keyed rounds and target-only steps here, several requests per loop tick so they share
one kernel call, and every decision must equal ``reference.oracle_round`` /
``oracle_target_only`` with the contract's keyed draws (under the verifier's draw seed,
pp1q.core.drawkey) on the rows the kernel decides with, floor(p * 2^61) / 2^61
(pp1q.verifier.kernel_rounds), on either CPU decision path (numba, the default where it
is installed, and the torch lazy step: pp1q_kernels.numba_rows). Regimes: close, far and
adversarial (draft = -target) drafts, top-k supports, q = p (every draft accepted),
dense q rows read in place as a received REPLY's, float64 target rows (the toy's) and
float32-rounded ones (a GPU target's).
"""

from __future__ import annotations

import asyncio
import importlib.util

import numpy as np
import pytest
from decider_cases import DEPTH, REGIMES, SLOTS, VOCAB, TableTarget, make_round, proposal

from pp1q.core import reference as ref
from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import DistributionError, Reason
from pp1q.core.verify import RoundKeys, target_only_draw
from pp1q.verifier.api import GenerateRequest
from pp1q.verifier.daemon import STANDARD
from pp1q.verifier.job import Job
from pp1q.verifier.kernel_decider import KernelDecider
from pp1q.wire.events import ProposalReady
from pp1q_kernels import numba_rows


def fixed_point(p: np.ndarray) -> np.ndarray:
    """floor(p * 2^61) / 2^61, exactly (every such value is a float64)."""
    return np.floor(p * 2.0**61) * 2.0**-61


def request(g, slot: int, prompt_len: int):
    seed = int(g.integers(0, 2**64, dtype=np.uint64))
    prompt = [int(x) for x in g.integers(0, VOCAB, prompt_len)] + [slot]
    req = GenerateRequest(prompt=prompt, max_tokens=8, seed=seed, speculative=True,
                          greedy=False, draft_temperature=1.0, top_k=None)
    return Job(req, slot)


def oracle(p, q, ready: ProposalReady, keys: RoundKeys):
    d = ref.oracle_round(list(fixed_point(p)), q, list(ready.draft_ids),
                         ref.RoundDraws.from_keys(keys, DEPTH))
    return d.accepted, d.token


async def _ticks(decider, g, ticks: int, float32: bool, calls: list[int]):
    kinds = set()
    for n in range(ticks):
        jobs, rounds, want = [], [], []
        for slot in range(SLOTS):
            job = request(g, slot, 3 + n % 4)
            p, q = make_round(g, REGIMES[(n + slot) % len(REGIMES)], float32)
            decider.target.table[tuple(job.req.prompt)] = p
            generation, round_id = int(g.integers(1, 1 << 24)), int(g.integers(1, 1 << 20))
            step, ready = proposal(job, q, generation, round_id)
            jobs.append(job)
            rounds.append((step, ready))
            want.append(oracle(p, q, ready, RoundKeys(decider.draws.seed_for(job.req.seed),
                                                      generation, round_id,
                                                      step.first_position)))
        before = len(calls)
        got = await asyncio.gather(*(decider.decide_round(j, s, r)
                                     for j, (s, r) in zip(jobs, rounds, strict=True)))
        assert len(calls) == before + 1  # the tick's rounds shared one kernel call
        assert [(o.accepted, o.token) for o, _ in got] == want
        kinds |= {(a == DEPTH, a) for a, _ in want}
        for job in jobs:  # target-only steps after the same prefixes
            generation, round_id = int(g.integers(1, 1 << 24)), int(g.integers(1, 1 << 20))
            position = len(job.prefix.tokens)
            out = await decider.decide_target_only(job, generation, round_id)
            p0 = decider.target.table[tuple(job.req.prompt)][0]
            u = target_only_draw(RoundKeys(decider.draws.seed_for(job.req.seed), generation,
                                           round_id, position), position)
            assert out.token == ref.oracle_target_only(list(fixed_point(p0)), u)
    return kinds


def run_ticks(seed: int, ticks: int, float32: bool, backend: str = "auto") -> set:
    """``backend``: the CPU decision path (PP1Q_DECIDE; auto is what the daemon runs)."""
    before = numba_rows.select(backend)
    try:
        decider = STANDARD.local(TableTarget(VOCAB), slots=SLOTS, depth=DEPTH,
                                 draws=DrawKeys.generate())
    finally:
        numba_rows.select(before)
    assert isinstance(decider, KernelDecider)  # the qualification is of what the daemon runs
    calls: list[int] = []
    sampled = decider.kernel.sampled

    def counted(*a):
        calls.append(len(a[0]))
        return sampled(*a)

    decider.kernel.sampled = counted
    return asyncio.run(_ticks(decider, np.random.default_rng(seed), ticks, float32, calls))


numba_missing = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                   reason="numba not installed (the fast extra)")


@pytest.mark.parametrize("backend", ["auto", pytest.param("numba", marks=numba_missing),
                                     "torch"])
@pytest.mark.parametrize("float32", [False, True])
def test_service_decider_equals_oracle(float32, backend):
    kinds = run_ticks(40 + float32, 100 if backend == "auto" else 40, float32, backend)
    assert {bonus for bonus, _ in kinds} == {True, False}
    assert {a for _, a in kinds} == set(range(DEPTH + 1))  # every accepted count reached


@pytest.mark.slow
def test_service_decider_equals_oracle_long():
    run_ticks(42, 2_500, False)


def test_a_refused_row_fails_only_its_own_round():
    g = np.random.default_rng(43)
    decider = STANDARD.local(TableTarget(VOCAB), slots=2, depth=DEPTH,
                             draws=DrawKeys.generate())
    jobs, rounds = [], []
    for slot in range(2):
        job = request(g, slot, 4)
        p, q = make_round(g, "far", False)
        if slot == 1:
            p[0, 0] = np.nan
        decider.target.table[tuple(job.req.prompt)] = p
        jobs.append(job)
        rounds.append(proposal(job, q, 1, 1))

    async def go():
        return await asyncio.gather(*(decider.decide_round(j, s, r)
                                      for j, (s, r) in zip(jobs, rounds, strict=True)),
                                    return_exceptions=True)

    good, bad = asyncio.run(go())
    assert not isinstance(good, BaseException)
    assert isinstance(bad, DistributionError) and bad.reason is Reason.NON_FINITE
