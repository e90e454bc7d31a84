"""EngineDecider (real models' Decider) decides the sampled rounds one forward scored
together in one pp1q_kernels call (pp1q.verifier.round_batch), as KernelDecider does the
toy's: the issue's "one call per round batched over its requests". Batching changes no
decision: the same rounds decided one at a time give the same outcomes. The toy target
behind the engine seam stands in for a real model (pp1q.models.toy_engine)."""

from __future__ import annotations

import asyncio

import numpy as np

from pp1q.core.drawkey import DrawKeys
from pp1q.core.q import build_row
from pp1q.models.toy import ToySpec, ToyTarget
from pp1q.models.toy_engine import ToyTargetEngine
from pp1q.verifier.api import GenerateRequest
from pp1q.verifier.engine_decider import EngineDecider
from pp1q.verifier.job import Job
from pp1q.wire import Step
from pp1q.wire.events import ProposalReady

VOCAB, DEPTH, REQUESTS = 64, 3, 4
PROMPT = [1, 2, 3]


def _round(slot: int) -> tuple[Job, Step, ProposalReady]:
    """A request's first round: drafts each with q > 0 in its own row (any such q is a
    legal proposal; the scheduler's re-derivation is not the decider's to check)."""
    g = np.random.default_rng(slot)
    rows = [build_row(g.normal(size=VOCAB) * 2.0, top_k=8) for _ in range(DEPTH)]
    drafts = tuple(int(r.ids[int(g.integers(r.ids.size))]) for r in rows)
    job = Job(GenerateRequest(prompt=PROMPT, max_tokens=8, seed=100 + slot, speculative=True,
                              greedy=False, draft_temperature=1.0, top_k=8), slot)
    job.generation, job.round_id = 1, 1
    step = Step(session=1, slot=slot, generation=1, round_id=1, last_committed=len(PROMPT) - 1,
                first_position=len(PROMPT), prefix_digest=job.prefix.digest, depth=DEPTH,
                temperature=1.0, top_k=8, context_version=0, seed=100 + slot)
    return job, step, ProposalReady(slot, 1, 1, len(PROMPT), drafts, rows, (), False)


async def _decide(together: bool) -> tuple[list, int, int]:
    """(outcomes by slot, kernel calls, forwards) for REQUESTS rounds, all at once or one
    after another, on a fresh decider and target."""
    decider = EngineDecider(ToyTargetEngine(ToyTarget(ToySpec(vocab=VOCAB))), slots=REQUESTS,
                            depth=DEPTH, draws=DrawKeys(bytes(range(32))))
    calls, sampled = [], decider.batch.kernel.sampled

    def counted(*args):  # the kernel seam the batch decides through, counted
        calls.append(len(args[0]))
        return sampled(*args)

    decider.batch.kernel.sampled = counted
    rounds = [_round(slot) for slot in range(REQUESTS)]
    for job, _, _ in rounds:
        await decider.open(job)
    if together:
        outs = await asyncio.gather(*(decider.decide_round(*r) for r in rounds))
    else:
        outs = [await decider.decide_round(*r) for r in rounds]
    for job, _, _ in rounds:
        decider.close(job)
    return [out for out, _ in outs], len(calls), decider.forwards


async def test_rounds_scored_together_are_decided_in_one_kernel_call():
    together, calls, forwards = await _decide(True)
    assert forwards == 1 and calls == 1  # one forward for the four, one decision call
    alone, calls, forwards = await _decide(False)
    assert forwards == REQUESTS and calls == REQUESTS
    assert together == alone  # the same decisions, batched or not
    assert any(o.accepted < DEPTH for o in alone)  # rejections decided too, not only bonus
