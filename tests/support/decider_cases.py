"""The Decider tests' rounds (tests/verifier): a table target and random rounds with the
q rows that sampled their drafts (fixed seeds through the caller's generator)."""

from __future__ import annotations

import numpy as np
from kernels_cases import received_dense

from pp1q.core.q import MASS, build_row, sample
from pp1q.core.rng import proposal_u24
from pp1q.models.processors import Processors
from pp1q.models.toy import TargetModel, softmax64
from pp1q.verifier.api import GenerateRequest
from pp1q.verifier.job import Job
from pp1q.wire import Step
from pp1q.wire.events import ProposalReady

DEPTH = 3
VOCAB = 23
SLOTS = 4
# "received": far drafts' full-support rows as a verifier holds a received dense REPLY
# (FP32 read in place), so the residual pick reads q from the FP32 row
REGIMES = ("close", "far", "adversarial", "sparse", "equal", "received")
# the target processors the Decider tests' requests cycle through (greedy ones use none)
PROCESSORS = [Processors(), Processors(0.6), Processors(1.0, 4), Processors(1.4, None, 0.7),
              Processors(0.8, 6, 0.9)]


class TableTarget(TargetModel):
    """A target whose rows are given per prompt (rows past len(draft) + 1 unused)."""

    identity = "table"

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.table: dict[tuple[int, ...], np.ndarray] = {}

    def logits(self, prefix, draft):
        return np.log(self.probs(prefix, draft))

    def probs(self, prefix, draft, out=None):
        rows = self.table[tuple(prefix)][: len(draft) + 1]
        if out is None:
            return rows.copy()
        out[:] = rows
        return out


def make_round(g, regime: str, float32: bool):
    """(p [D+1, V], q rows [D])."""
    t = g.normal(0.0, 2.0, (DEPTH + 1, VOCAB))
    p = softmax64(t)
    if float32:
        p = p.astype(np.float32).astype(np.float64)
    d = {"close": t[:DEPTH] + g.normal(0.0, 0.3, (DEPTH, VOCAB)),
         "far": g.normal(0.0, 2.0, (DEPTH, VOCAB)), "adversarial": -t[:DEPTH],
         "sparse": t[:DEPTH] + g.normal(0.0, 1.0, (DEPTH, VOCAB)), "equal": t[:DEPTH],
         "received": g.normal(0.0, 2.0, (DEPTH, VOCAB))}[regime]
    q = [build_row(d[i], top_k=4 if regime == "sparse" else None) for i in range(DEPTH)]
    if regime == "received":
        q = [received_dense(r) for r in q]
    if regime == "equal":  # p is exactly q: every draft accepted, the bonus decides
        p[:DEPTH] = np.stack([r.dense_counts() for r in q]) / MASS
    return p, q


def request_job(g, slot: int, n: int) -> Job:
    """Request n's job on ``slot``: every 7th greedy, the others cycling PROCESSORS."""
    greedy = n % 7 == 3
    prompt = [int(x) for x in g.integers(0, VOCAB, 3 + n % 4)] + [slot]
    req = GenerateRequest(prompt=prompt, max_tokens=8, seed=int(g.integers(0, 2**63)),
                          speculative=True, greedy=greedy, draft_temperature=1.0, top_k=None,
                          processors=Processors() if greedy else PROCESSORS[n % len(PROCESSORS)])
    return Job(req, slot)


def proposal(job: Job, q, generation: int, round_id: int):
    first = len(job.req.prompt)
    step = Step(session=1, slot=job.slot, generation=generation, round_id=round_id,
                last_committed=first - 1, first_position=first, prefix_digest=0, depth=DEPTH,
                temperature=1.0, top_k=0, context_version=0, seed=job.req.seed)
    drafts = tuple(sample(q[i], proposal_u24(job.req.seed, generation, round_id, first + i))
                   for i in range(DEPTH))
    ready = ProposalReady(job.slot, generation, round_id, first, drafts, q, (), False)
    return step, ready
