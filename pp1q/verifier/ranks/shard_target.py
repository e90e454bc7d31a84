"""A target's LM head split by vocabulary rows: one rank's logits, never a full row.

Two shards answer ``logits(slot, prefix, drafts)`` with torch logits [len(drafts) + 1,
hi - lo] for the ids [lo, hi), and ``close(slot)``:

- ``ToyShard`` (here) keeps rows [lo, hi) of the toy target's output embedding and
  unigram bias (pp1q.models.toy._ToyWeights) and computes the same expression as
  ``ToyTarget.logits`` for those ids only; the context embedding (E_in) stays whole, as
  a vocabulary-parallel LM head keeps its input replicated. The product is one dot
  product of TOY_RANK terms per id, summed in one order (pp1q.models.toy.project_rows),
  so a shard's logits equal the same ids of the whole row bit for bit, for any number of
  rows (tests/verifier/ranks/test_ranks_shard_daemon.py, tests/models/test_toy_engine.py
  check it). It keeps nothing per slot.
- ``HFShard`` (pp1q.models.hf_shard) is a Hugging Face model's head rows over its whole
  decoder, with a K/V cache per slot; it is cut when the model is loaded
  (pp1q.models.serving.load_target), so the full head is never kept.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch

from pp1q.core.errors import ConfigError
from pp1q.models.toy import ToyTarget, context_columns, project_rows


class ToyShard:
    def __init__(self, target: ToyTarget, lo: int, hi: int) -> None:
        w = target._w  # noqa: SLF001 - the toy's own weights, sliced once
        self.lo, self.hi, self.vocab = lo, hi, target.vocab
        self.identity = target.identity
        self._embed = w.embed
        self._out = np.ascontiguousarray(w.e_out_scaled[lo:hi].T)  # [r, width]
        self._bias = w.bias[lo:hi].copy()

    def logits(self, slot: Hashable, prefix: Sequence[int], draft: Sequence[int]
               ) -> torch.Tensor:
        """FP64 logits [len(draft) + 1, hi - lo] of this shard's ids (ToyTarget.logits)."""
        return torch.from_numpy(project_rows(context_columns(self._embed, prefix, draft),
                                             self._out, self._bias))

    def close(self, slot: Hashable) -> None:
        """Nothing is kept per slot."""


def shard_of(target, lo: int, hi: int):
    """This rank's shard [lo, hi) of ``target``: the toy's rows are cut here; a real
    model's shard was cut at load and must hold exactly these ids."""
    if isinstance(target, ToyTarget):
        return ToyShard(target, lo, hi)
    if (target.lo, target.hi) != (lo, hi):
        raise ConfigError(f"this rank's target shard holds ids [{target.lo}, {target.hi}), "
                          f"the group's split gives it [{lo}, {hi})", key="shard_vocab")
    return target
