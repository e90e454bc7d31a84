"""Random batches shared by the kernel tests (fixed seeds; small vocabularies)."""

from __future__ import annotations

import numpy as np
import torch

from pp1q.core.q import MASS, DyadicRow, build_row, dense_row_of_valid, validate_dense
from pp1q.core.verify import RoundKeys
from pp1q_kernels.lookup import from_rows
from pp1q_kernels.proposal import sample_counts


def target(g: np.random.Generator, shape, scale=2.0, dtype=torch.float32) -> torch.Tensor:
    """Target rows p: a float32 softmax of normal logits (as a GPU target produces)."""
    logits = torch.tensor(g.normal(0.0, scale, shape), dtype=torch.float32)
    return torch.softmax(logits, -1).to(dtype)


def received_dense(row: DyadicRow) -> DyadicRow:
    """``row`` as the verifier holds a received dense row (pp1q.wire.validate.Rows): its
    FP32 q validated, read-only, read in place; the support extracted only if read."""
    q = row.to_dense()
    q.flags.writeable = False
    return dense_row_of_valid(validate_dense(q, row.vocab), row.vocab)


def drafts(g, lead, vocab, *, top_k=None, temperature=1.0, logits=None):
    """(SparseCounts [*lead, K], flat list of DyadicRows) built by pp1q.core.q.build_row."""
    n = int(np.prod(lead))
    x = g.normal(0.0, 2.0, (n, vocab)) if logits is None else np.asarray(logits).reshape(n, vocab)
    rows = [build_row(x[i], temperature=temperature, top_k=top_k) for i in range(n)]
    return from_rows(rows).reshape(*lead), rows


def keys(g, n) -> list[RoundKeys]:
    return [RoundKeys(int(g.integers(0, 2**64, dtype=np.uint64)), int(g.integers(0, 1 << 24)),
                      int(g.integers(0, 1 << 20)), int(g.integers(0, 1 << 20))) for _ in range(n)]


def u53(g, shape) -> torch.Tensor:
    return torch.tensor(g.integers(0, 2**53, shape), dtype=torch.int64)


def u24(g, shape) -> torch.Tensor:
    return torch.tensor(g.integers(0, MASS, shape), dtype=torch.int64)


def sampled_drafts(g, q) -> torch.Tensor:
    """Draft tokens drawn from their own q rows (so q(x) > 0 always)."""
    return sample_counts(q, u24(g, tuple(q.ids.shape[:-1])))


def same(a, b) -> bool:
    """Bit-identical tensors or tuples/results of tensors."""
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if hasattr(a, "accepted"):
        return all(same(x, y) for x, y in zip((a.accepted, a.token, a.underflow),
                                             (b.accepted, b.token, b.underflow), strict=True))
    if hasattr(a, "ids") and hasattr(a, "counts"):
        return same(a.ids, b.ids) and same(a.counts, b.counts) and a.vocab == b.vocab
    return all(same(x, y) for x, y in zip(a, b, strict=True))
