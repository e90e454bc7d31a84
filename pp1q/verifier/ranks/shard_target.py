"""The toy target's LM head split by vocabulary rows: one rank's logits, never a full row.

``ToyShard`` keeps rows [lo, hi) of the toy target's output embedding and unigram bias
(pp1q.models.toy._ToyWeights) and computes the same expression as ``ToyTarget.logits``
for those ids only; the context embedding (E_in) stays whole, as a vocabulary-parallel
LM head keeps its input replicated. The product is one dot product of TOY_RANK terms per
id, so a shard's logits equal the same ids of the whole row bit for bit
(tests/verifier/ranks/test_ranks_shard_daemon.py checks it). The Hugging Face adapter's
LM head is not split yet (docs/operations.md, "Vocabulary-sharded ranks").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pp1q.models.toy import TOY_SECOND_ORDER, ToyTarget


class ToyShard:
    def __init__(self, target: ToyTarget, lo: int, hi: int) -> None:
        w = target._w  # noqa: SLF001 - the toy's own weights, sliced once
        self.lo, self.hi, self.vocab = lo, hi, target.vocab
        self.identity = target.identity
        self._embed = w.embed
        self._out = np.ascontiguousarray(w.e_out_scaled[lo:hi].T)  # [r, width]
        self._bias = w.bias[lo:hi].copy()

    def logits(self, prefix: Sequence[int], draft: Sequence[int]) -> np.ndarray:
        """FP64 logits [len(draft) + 1, hi - lo] of this shard's ids (ToyTarget.logits)."""
        ctx = [int(t) for t in prefix[-2:]] + [int(t) for t in draft]
        n0 = min(len(prefix), 2)
        cols = []
        for i in range(len(draft) + 1):
            end = n0 + i
            c1 = ctx[end - 1] if end >= 1 else None
            c2 = ctx[end - 2] if end >= 2 else None
            cols.append(self._embed(c1) + TOY_SECOND_ORDER * self._embed(c2))
        return np.add(np.stack(cols, axis=1).T @ self._out, self._bias)
