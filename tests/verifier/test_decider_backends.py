"""The service's Decider decides identically on both CPU decision backends (numba and the
torch lazy step, pp1q_kernels.numba_rows' PP1Q_DECIDE choice), through the Decider seam:
the same rounds (sparse and dense q, every regime, the request's target processors, greedy
requests) and target-only steps on two KernelDeciders built as the daemon builds them,
one per backend. tests/verifier/test_decider_qualification.py qualifies the default
(what ``auto`` chooses) against the rational oracle; tests/kernels/test_kernels_numba.py
holds the two kernels to each other at the draw boundaries."""

from __future__ import annotations

import asyncio
import importlib.util

import numpy as np
import pytest
from decider_cases import (
    DEPTH,
    REGIMES,
    SLOTS,
    VOCAB,
    TableTarget,
    make_round,
    proposal,
    request_job,
)

from pp1q.core.drawkey import DrawKeys
from pp1q.verifier.daemon import STANDARD
from pp1q_kernels import numba_rows

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba not installed (the fast extra)")


def decider(backend: str, draws: DrawKeys):
    before = numba_rows.select(backend)
    try:
        d = STANDARD.local(TableTarget(VOCAB), slots=SLOTS, depth=DEPTH, draws=draws)
    finally:
        numba_rows.select(before)
    assert (d.kernel._numba is not None) == (backend == "numba")
    return d


async def run(deciders, seed: int, ticks: int):
    g = np.random.default_rng(seed)
    out = {id(d): [] for d in deciders}
    for n in range(ticks):
        rounds = []
        for slot in range(SLOTS):
            j = request_job(g, slot, n + slot)
            p, q = make_round(g, REGIMES[(n + slot) % len(REGIMES)], n % 2 == 1)
            for d in deciders:
                d.target.table[tuple(j.req.prompt)] = p
            step, ready = proposal(j, q, int(g.integers(1, 1 << 24)), int(g.integers(1, 1 << 20)))
            if j.req.greedy:
                ready = type(ready)(ready.slot, ready.generation, ready.round_id,
                                    ready.first_position, ready.draft_ids, (), (), True)
            rounds.append((j, step, ready))
        for d in deciders:
            got = await asyncio.gather(*(d.decide_round(j, s, r) for j, s, r in rounds))
            out[id(d)] += [(o.accepted, o.token, kind) for o, kind in got]
            for j, s, _ in rounds:
                o = await d.decide_target_only(j, s.generation + 1, s.round_id)
                out[id(d)].append((o.accepted, o.token))
    return [out[id(d)] for d in deciders]


def test_numba_and_torch_deciders_decide_alike():
    draws = DrawKeys.generate()
    fast, slow = decider("numba", draws), decider("torch", draws)
    a, b = asyncio.run(run([fast, slow], 70, 30))
    assert a == b
    assert {x[0] for x in a if len(x) == 3} == set(range(DEPTH + 1))
