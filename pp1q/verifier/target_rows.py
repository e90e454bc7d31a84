"""Target rows into per-slot buffers, then the decision: shared by every decider.

One process (pp1q.verifier.decider.LocalDecider) and each rank's replica
(pp1q.verifier.ranks.replica) compute here: the target's rows for the positions after
the committed prefix and each draft, written into a buffer preallocated per slot
(depth + 1 rows of vocab float64), then the pure decision functions of
pp1q.verifier.rounds with the round's keys.

The request's target processors (temperature, top-k, top-p) are applied here, by the one
function (pp1q.models.processors) that serves both a round's p and a target-only step's
p: if only one path applied them, speculative output would stop being target output.
The default set (T = 1, nothing else) keeps the toy's own float64 softmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pp1q.core.q import DyadicRow
from pp1q.core.verify import RoundKeys
from pp1q.models.processors import Processors
from pp1q.models.toy import TargetModel
from pp1q.verifier import rounds


class TargetRows:
    def __init__(self, target: TargetModel, slots: int, depth: int) -> None:
        self.target = target
        self._p = np.empty((slots, depth + 1, target.vocab), dtype=np.float64)  # sized once

    def rows(self, slot: int, prefix: Sequence[int], drafts: Sequence[int], *,
             logits: bool, processors: Processors | None = None) -> np.ndarray:
        """Rows for x_1..x_n and the bonus position: raw logits (argmax needs no
        softmax: greedy) or the probabilities p after ``processors``."""
        out = self._p[slot, : len(drafts) + 1]
        if logits:
            out[:] = self.target.logits(prefix, drafts)
            return out
        if processors is None or processors.is_default:
            return self.target.probs(prefix, drafts, out=out)
        out[:] = processors.probs(torch.from_numpy(self.target.logits(prefix, drafts))).numpy()
        return out

    def round(self, slot: int, prefix: Sequence[int], drafts: Sequence[int],
              q_rows: Sequence[DyadicRow], keys: RoundKeys, greedy: bool,
              processors: Processors | None = None) -> rounds.Outcome:
        """Decide a proposal: greedy (v1) or standard verification (``keys.first_position``:
        x_1's absolute position; ``keys.seed``: the verifier's draw seed)."""
        p = self.rows(slot, prefix, drafts, logits=greedy, processors=processors)
        if greedy:
            return rounds.greedy(p, drafts)
        return rounds.sampled(p, q_rows, drafts, keys)

    def target_only(self, slot: int, prefix: Sequence[int], draw_seed: int, generation: int,
                    round_id: int, greedy: bool,
                    processors: Processors | None = None) -> rounds.Outcome:
        """One token from the target alone, at position len(prefix) (``draw_seed``: the
        verifier's, pp1q.core.drawkey)."""
        p = self.rows(slot, prefix, [], logits=greedy, processors=processors)
        return rounds.target_only(p[0], draw_seed, generation, round_id, len(prefix), greedy)
