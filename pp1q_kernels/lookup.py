"""Batched q rows and sparse q lookup by global id (kernel 4).

A q batch is either a dense int64 count tensor [..., V] or a ``SparseCounts``: rows of
at most K (id, count) entries, real entries first in strictly ascending id order, then
padding lanes with id == vocab and count 0. The padding id sorts after every real id
(so binary search stays valid) and can never equal a token < vocab, so a padded lane
can never be looked up, scattered or sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.q import MASS, DyadicRow


@dataclass(frozen=True)
class SparseCounts:
    ids: torch.Tensor  # [..., K] int64: ascending real ids, then padding == vocab
    counts: torch.Tensor  # [..., K] int64: > 0 on real lanes, 0 on padding
    vocab: int

    @property
    def width(self) -> int:
        return int(self.ids.shape[-1])

    @property
    def real(self) -> torch.Tensor:
        return self.ids < self.vocab

    def reshape(self, *shape) -> SparseCounts:
        k = self.width
        return SparseCounts(self.ids.reshape(*shape, k), self.counts.reshape(*shape, k), self.vocab)

    def index(self, *idx) -> SparseCounts:
        """Rows selected by advanced indexing over the leading dims."""
        return SparseCounts(self.ids[idx], self.counts[idx], self.vocab)

    def check(self) -> None:
        """Structural invariants; a violation is our bug, never a peer's."""
        ids, counts, real = self.ids, self.counts, self.real
        bad = (ids < 0) | (ids > self.vocab) | (real & (counts <= 0)) | (~real & (counts != 0))
        if ids.shape[-1] > 1:
            step = ids[..., 1:] - ids[..., :-1]
            bad_step = (step <= 0) & real[..., 1:]  # real ids strictly ascending
            bad_step |= ~real[..., :-1] & real[..., 1:]  # no real id after padding
            bad = bad[..., 1:] | bad_step
        if bool(bad.any()):
            raise LocalProtocolError(Reason.NON_CANONICAL, "sparse q batch is not canonical")
        if bool((counts.sum(-1) != MASS).any()):
            raise LocalProtocolError(Reason.WRONG_MASS, "sparse q row does not sum to 2^24")


def from_rows(rows: Sequence[DyadicRow], width: int | None = None, device=None) -> SparseCounts:
    """Stack DyadicRows into a [len(rows), width] batch (width >= every support)."""
    vocab = rows[0].vocab
    need = max(r.support_size for r in rows)
    width = need if width is None else width
    if width < need or any(r.vocab != vocab for r in rows):
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "rows do not fit one batch")
    ids = torch.full((len(rows), width), vocab, dtype=torch.int64)
    counts = torch.zeros((len(rows), width), dtype=torch.int64)
    for n, r in enumerate(rows):
        ids[n, : r.support_size] = torch.from_numpy(r.ids.astype("int64"))
        counts[n, : r.support_size] = torch.from_numpy(r.counts)
    return SparseCounts(ids.to(device), counts.to(device), vocab)


def to_rows(q: SparseCounts) -> list[DyadicRow]:
    """Back to DyadicRows (validates every row)."""
    ids, counts = q.ids.reshape(-1, q.width).cpu(), q.counts.reshape(-1, q.width).cpu()
    keep = ids < q.vocab
    return [DyadicRow(q.vocab, ids[n][keep[n]].numpy(), counts[n][keep[n]].numpy())
            for n in range(ids.shape[0])]


def compact(ids: torch.Tensor, counts: torch.Tensor, keep: torch.Tensor,
            vocab: int) -> SparseCounts:
    """Keep the lanes where ``keep``; move them (order kept) before padding lanes."""
    k = ids.shape[-1]
    lane = torch.arange(k, device=ids.device)
    order = torch.argsort((~keep).to(torch.int64) * k + lane, dim=-1)
    keep = keep.gather(-1, order)
    ids = torch.where(keep, ids.gather(-1, order), vocab)
    counts = torch.where(keep, counts.gather(-1, order), 0)
    return SparseCounts(ids, counts, vocab)


def count_at(q, tokens: torch.Tensor) -> torch.Tensor:
    """Count of ``tokens`` [...] in q rows [..., V] or SparseCounts [..., K]; 0 if absent."""
    tokens = tokens.to(torch.int64)
    rows = q.ids if isinstance(q, SparseCounts) else q
    lead = torch.broadcast_shapes(rows.shape[:-1], tokens.shape)
    tokens = tokens.expand(lead).unsqueeze(-1)
    if isinstance(q, SparseCounts):
        ids = q.ids.expand(*lead, q.width)
        pos = torch.searchsorted(ids.contiguous(), tokens.contiguous()).clamp_(max=q.width - 1)
        hit = ids.gather(-1, pos) == tokens
        return torch.where(hit, q.counts.expand(*lead, q.width).gather(-1, pos), 0).squeeze(-1)
    return q.expand(*lead, q.shape[-1]).gather(-1, tokens).squeeze(-1).to(torch.int64)


def dense_counts(q) -> torch.Tensor:
    """Dense int64 counts [..., V] (padding lanes dropped)."""
    if not isinstance(q, SparseCounts):
        return q.to(torch.int64)
    out = torch.zeros(*q.ids.shape[:-1], q.vocab + 1, dtype=torch.int64, device=q.ids.device)
    out.scatter_(-1, q.ids, q.counts)  # padding lands in the extra column, then dropped
    return out[..., : q.vocab]


def restrict(q: SparseCounts, lo: int, hi: int) -> SparseCounts:
    """The entries of one vocabulary shard [lo, hi), re-based to local ids."""
    keep = (q.ids >= lo) & (q.ids < hi)
    return compact(q.ids - lo, q.counts, keep, hi - lo)


def shard_q(q, lo: int, hi: int):
    """q restricted to shard [lo, hi): dense slice or re-based sparse entries."""
    if isinstance(q, SparseCounts):
        return restrict(q, lo, hi)
    return q[..., lo:hi]
