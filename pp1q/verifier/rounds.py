"""Decisions of one scheduling step, given target rows: pure functions, no I/O.

Sampled rounds follow docs/distribution.md through pp1q_kernels (exact integers,
pp1q.verifier.kernel_rounds: the rule the service decides with, one round at a time
here); greedy (v1) rounds accept the longest prefix of drafts equal to the target's
argmax; target-only steps draw in the TARGET_ONLY domain at the position they produce.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pp1q.core.q import DyadicRow, sample
from pp1q.core.rng import proposal_u24
from pp1q.core.verify import RoundKeys
from pp1q.verifier.kernel_rounds import KernelRounds
from pp1q.verifier.outcome import Outcome

__all__ = ["Outcome", "greedy", "proposal_matches", "sampled", "target_only"]


def sampled(p, q_rows: Sequence[DyadicRow], drafts: Sequence[int],
            keys: RoundKeys, kernel: KernelRounds | None = None) -> Outcome:
    """Standard verification; ``keys.first_position`` is the absolute position of x_1 and
    ``keys.seed`` the verifier's draw seed (pp1q.core.drawkey), never the STEP's seed;
    ``p`` and ``kernel`` as ``target_only`` takes them."""
    return (kernel or KernelRounds()).sampled([p], [q_rows], [drafts], [keys])[0]


def proposal_matches(q_rows: Sequence[DyadicRow], drafts: Sequence[int],
                     keys: RoundKeys) -> bool:
    """Each x_i is what q_i and the PROPOSAL-domain key give (docs/distribution.md step 1);
    ``keys.seed`` is the request seed the STEP carried.

    The verifier knows the request seed, so it re-derives every proposal: a q that is not
    the q that sampled (built at another temperature, from other logits, one row shifted)
    is caught on the round it happens, not only in distribution. It proves nothing
    against a worker that lies on purpose (docs/security.md).
    """
    return all(
        int(x) == sample(q, proposal_u24(keys.seed, keys.generation, keys.round_id,
                                         keys.first_position + i))
        for i, (q, x) in enumerate(zip(q_rows, drafts, strict=True))
    )


def _argmax(rows) -> list[int] | int:
    """The argmax of each row (ties: lowest id; a NaN counts as the largest, as numpy's
    and torch's both take it); a tensor's where it is, so only the ids cross."""
    if isinstance(rows, torch.Tensor):
        return rows.argmax(-1).tolist()
    return np.argmax(rows, axis=-1).tolist()


def greedy(target_rows, drafts: Sequence[int]) -> Outcome:
    """v1 greedy: accept while draft == argmax (ties: lowest id), then the target's argmax.
    ``target_rows``: numpy, or a torch tensor on any device."""
    best = _argmax(target_rows)
    accepted = 0
    while accepted < len(drafts) and int(drafts[accepted]) == best[accepted]:
        accepted += 1
    return Outcome(accepted, best[accepted])


def target_only(p_row, draw_seed: int, generation: int, round_id: int,
                position: int, is_greedy: bool, kernel: KernelRounds | None = None) -> Outcome:
    """One token at absolute ``position`` from the target alone (the verifier's draw seed);
    ``p_row`` [V]: numpy, or a torch tensor (on ``kernel``'s device: the decider's own
    kernel; else the CPU's). Greedy: an argmax, where the row is."""
    if is_greedy:
        return Outcome(0, _argmax(p_row))
    keys = RoundKeys(draw_seed, generation, round_id, position)
    return (kernel or KernelRounds()).target_only(p_row, keys, position)
