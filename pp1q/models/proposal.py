"""A proposal chain through the incremental ``Drafter`` seam: rows, q, draws.

The same contract as the worker's toy chain (pp1q.worker.proposer.propose): row i is
built from the drafter's logits after x_1..x_{i-1}, turned into the dyadic q that
samples x_i with the PROPOSAL-domain draw at absolute position first_position + i - 1. The q
yielded is built from exactly the logits yielded (nothing is recomputed), so the q on
the wire is the q that sampled.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from pp1q.core.q import DyadicRow, build_row, sample
from pp1q.core.rng import proposal_u24
from pp1q.models.engine import Drafter, RequestKey


class HostStaging:
    """The drafter's logits on the host, where build_row reads them: a CPU tensor as it
    is; a CUDA tensor copied into one preallocated page-locked buffer, reused row
    after row (the design's "preallocated registered host staging": the copy DMAs into
    memory kept for it, not into a fresh pageable tensor a row). build_row widens what
    it reads into rows of its own, so nothing it returns views the buffer."""

    def __init__(self) -> None:
        self._pinned: torch.Tensor | None = None

    def host(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.device.type == "cpu":
            return logits
        if not logits.is_cuda:  # no page-locked allocator promised elsewhere (mps, xpu)
            return logits.cpu()
        buf = self._pinned
        if buf is None or buf.shape != logits.shape or buf.dtype != logits.dtype:
            buf = self._pinned = torch.empty(logits.shape, dtype=logits.dtype, pin_memory=True)
        buf.copy_(logits)  # blocking: the row is read right after
        return buf


@dataclass(frozen=True)
class DraftStep:
    token: int
    row: DyadicRow
    logits: torch.Tensor  # what ``row`` was built from (kept for tests and captures)


def propose(drafter: Drafter, request: RequestKey, spec,
            staging: HostStaging | None = None) -> Iterator[DraftStep]:
    """Yield x_1..x_depth with their q rows; ``spec`` is a worker ProposalSpec;
    ``staging``: the caller's HostStaging, kept across chains (else one for this chain).

    The drafter holds every drafted token when the chain ends: each x_i (i < depth) is
    appended by the next row's forward, x_depth by ``append`` before it is yielded, so
    ``commit(request, accepted, token)`` may accept all of them.
    """
    staging = staging or HostStaging()
    prev: int | None = None
    for i in range(spec.depth):
        logits = drafter.next_logits(request, prev)
        row = build_row(staging.host(logits), temperature=spec.temperature, top_k=spec.top_k)
        token = sample(row, proposal_u24(spec.seed, spec.generation, spec.round_id,
                                         spec.first_position + i))
        if i + 1 == spec.depth:
            drafter.append(request, token)
        yield DraftStep(token, row, logits)
        prev = token
