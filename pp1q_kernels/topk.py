"""Global top-k support (kernel 2): k largest weights, ties by lowest global id.

torch.topk does not promise which of several equal values it returns, so only its
k-th value is used: every weight above it is taken, then the lowest-id weights equal
to it until k are chosen. Values are compared exactly, so the support is the same on
every backend. Sharded form: each shard's local top-k (with global ids) contains every
global winner it owns, so the exact global top-k is the top-k of the merged candidates
(candidates listed in ascending global id, so position order is id order).

On the CPU, where pp1q.core.q_backend's choice is numba (build_counts follows build_row
there), the positions come from one numba pass a row (numba_counts.top_positions: a heap
of the k best): the same positions, without torch.topk and five whole-row temporaries.
"""

from __future__ import annotations

import torch

from pp1q.core.errors import DistributionError, Reason

from .cpu_rows import numba_rows


def select_positions(values: torch.Tensor, k: int) -> torch.Tensor:
    """Positions [..., k] (ascending) of the k largest values, ties by lowest position."""
    n = values.shape[-1]
    if isinstance(k, bool) or not isinstance(k, int) or not 0 < k <= n:
        raise DistributionError(Reason.BAD_TOP_K, f"top_k {k!r} for {n} entries")
    fast = numba_rows(values)
    if fast is not None:
        numba_counts, rows = fast
        out = torch.empty(rows.shape[0], k, dtype=torch.int64)
        if numba_counts.top_positions(rows, k, out.numpy()) == 0:
            return out.reshape(*values.shape[:-1], k)
        # a row with a NaN, or one that kept replacing its heap: torch's form below
    kth = torch.topk(values, k, dim=-1).values[..., -1:]
    above = values > kth
    tied = values == kth
    need = k - above.sum(-1, keepdim=True)
    chosen = above | (tied & (tied.cumsum(-1) <= need))
    lead = values.shape[:-1]
    pos = torch.arange(n, device=values.device).expand_as(values)
    return pos[chosen].reshape(*lead, k)  # row-major order: ascending within each row


def topk_support(w: torch.Tensor, k: int) -> torch.Tensor:
    """Global ids [..., k] (ascending) of the k largest weights of rows [..., V]."""
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise DistributionError(Reason.BAD_TOP_K, f"top_k {k!r}")
    return select_positions(w, min(k, w.shape[-1]))  # k >= V: the whole vocabulary


def local_topk(w_shard: torch.Tensor, k: int, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A shard's candidates: (values, global ids), at most k, ascending global id."""
    pos = select_positions(w_shard, min(k, w_shard.shape[-1]))
    return w_shard.gather(-1, pos), pos + offset


def merge_topk(values: list[torch.Tensor], ids: list[torch.Tensor], k: int) -> torch.Tensor:
    """Exact global top-k ids from shard candidates (shards in ascending id order)."""
    vals = torch.cat(values, -1)
    gids = torch.cat(ids, -1)
    return gids.gather(-1, select_positions(vals, min(k, vals.shape[-1])))
