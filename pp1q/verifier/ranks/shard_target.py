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

from pp1q.models.toy import ToyTarget, context_columns


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
        return np.add(context_columns(self._embed, prefix, draft).T @ self._out, self._bias)
