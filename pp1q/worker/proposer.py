"""The toy model's proposal chain (pp1q.models.proposal is the same contract for engine
drafters): where the toy's proposal noise is drawn.

Row i is built from the drafter's backbone row i plus the Markov bias of x_{i-1}
(x_0 = last committed token), turned into the dyadic q that samples x_i with the
PROPOSAL-domain draw at absolute position first_position + i - 1. Rows are produced in order:
x_i must exist before row i + 1 can be built. The q yielded is the q that sampled.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from pp1q.core.q import DyadicRow, build_row, sample
from pp1q.core.rng import proposal_u24
from pp1q.models.toy import DraftModel


@dataclass(frozen=True)
class ProposalSpec:
    """Keys and policy of one proposal; identical specs must give identical rows."""

    seed: int
    generation: int
    round_id: int
    first_position: int  # absolute position of x_1 (= last committed position + 1)
    depth: int
    temperature: float
    top_k: int | None  # None: dense support


def propose(model: DraftModel, prefix: Sequence[int],
            spec: ProposalSpec) -> Iterator[tuple[int, DyadicRow]]:
    """Yield (x_i, q_i) for i = 1..depth, each as soon as it exists."""
    backbone = model.backbone(prefix, spec.depth)
    prev = int(prefix[-1]) if len(prefix) else None
    for i in range(spec.depth):
        logits = model.row_logits(backbone[i], prev)
        row = build_row(logits, temperature=spec.temperature, top_k=spec.top_k)
        token = sample(row, proposal_u24(spec.seed, spec.generation, spec.round_id,
                                         spec.first_position + i))
        yield token, row
        prev = token


def propose_greedy(model: DraftModel, prefix: Sequence[int], depth: int) -> list[int]:
    """v1 greedy drafts: argmax of each row (ties: lowest id), no q, no noise."""
    backbone = model.backbone(prefix, depth)
    prev = int(prefix[-1]) if len(prefix) else None
    out = []
    for i in range(depth):
        prev = int(np.argmax(model.row_logits(backbone[i], prev)))
        out.append(prev)
    return out
