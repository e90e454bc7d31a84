"""The worker's engine Proposer: same rows as the toy chain, and the drafter follows the
committed prefix (a commit kept, the same prefix reset, any other prefix reopened) without
any COMMIT hook."""

from __future__ import annotations

import numpy as np
import pytest

from pp1q.models.toy import ToyDrafter, ToySpec
from pp1q.models.toy_engine import ToyDrafterEngine
from pp1q.wire import Step
from pp1q.worker.drafting import Proposer
from pp1q.worker.engine_proposer import EngineProposer

VOCAB = 64


def _step(prefix, round_id, temperature=0.8, top_k=8, generation=1):
    return Step(session=7, slot=2, generation=generation, round_id=round_id,
                last_committed=len(prefix) - 1, first_position=len(prefix), prefix_digest=0,
                depth=5, temperature=temperature, top_k=top_k, context_version=0, seed=11)


def _rows(proposer, step, prefix):
    return [(t, None if r is None else (tuple(r.ids), tuple(r.counts)))
            for t, r in proposer.rows(step, prefix)]


@pytest.mark.parametrize("temperature, top_k", [(0.8, 8), (1.0, 0), (0.0, 0)])
def test_engine_rows_equal_the_toy_chain_across_commits_and_resets(temperature, top_k):
    drafter = ToyDrafter.preset(ToySpec(vocab=VOCAB, seed=3), "far")
    toy, engine = Proposer(drafter), EngineProposer(ToyDrafterEngine(drafter))
    rng = np.random.default_rng(0)
    prefix = [1, 2, 3]
    opened = []
    engine.drafter.open = (lambda orig: lambda *a: (opened.append(a[0]), orig(*a))[1])(
        engine.drafter.open)
    for round_id in range(1, 9):
        step = _step(prefix, round_id, temperature, top_k)
        got = _rows(engine, step, prefix)
        assert got == _rows(toy, step, prefix)
        drafts = [t for t, _ in got]
        if round_id == 5:
            continue  # a discarded round: same prefix again (reset, cache kept)
        accepted = int(rng.integers(0, len(drafts) + 1))
        prefix = prefix + drafts[:accepted] + [int(rng.integers(0, VOCAB))]
    assert len(opened) == 1  # every later round was a commit or a reset, never a reopen
    other = [9, 9]  # a context that does not extend the held one: reopened
    step = _step(other, 99, temperature, top_k)
    assert _rows(engine, step, other) == _rows(toy, step, other) and len(opened) == 2
