"""Integer categorical proposal (kernel 3): the first id whose cumulative count > u24.

Exact integer arithmetic, so every backend and sharding agrees bit for bit. A zero-count
id (and every padding lane) can never be first: its cumulative count equals its
predecessor's, which already failed the test or is the earlier winner.
"""

from __future__ import annotations

import torch

from pp1q.core.errors import DistributionError, Reason
from pp1q.core.q import MASS

from .lookup import SparseCounts
from .philox import keyed_u24


def check_draws(u24: torch.Tensor) -> torch.Tensor:
    u24 = u24.to(torch.int64)
    if u24.numel() and (int(u24.min()) < 0 or int(u24.max()) >= MASS):
        raise DistributionError(Reason.DRAW_OUT_OF_RANGE, "u24 outside [0, 2^24)")
    return u24


def first_above(cum: torch.Tensor, thr: torch.Tensor) -> torch.Tensor:
    """Index of the first cumulative value > thr along the last dim (cum nondecreasing)."""
    pos = torch.searchsorted(cum.contiguous(), thr.unsqueeze(-1).contiguous(), right=True)
    return pos.squeeze(-1)


def sample_counts(q, u24: torch.Tensor) -> torch.Tensor:
    """Token ids [...] drawn from q rows (dense counts [..., V] or SparseCounts)."""
    u24 = check_draws(u24)
    if isinstance(q, SparseCounts):
        lane = first_above(q.counts.cumsum(-1), u24)
        return q.ids.gather(-1, lane.unsqueeze(-1)).squeeze(-1)
    return first_above(q.to(torch.int64).cumsum(-1), u24)


def propose(q, seeds, generation, round_id, position) -> torch.Tensor:
    """Draft tokens for q rows [...] with each row's own keyed PROPOSAL draw."""
    return sample_counts(q, keyed_u24(seeds, generation, round_id, position))


def local_mass(q) -> torch.Tensor:
    """Count mass held by a shard's rows (for the leader's shard choice)."""
    counts = q.counts if isinstance(q, SparseCounts) else q
    return counts.to(torch.int64).sum(-1)
