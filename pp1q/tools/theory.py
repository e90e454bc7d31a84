"""Expected accepted length of a model pair, estimated in-process (no daemons).

For a drafted chain x_1..x_D with the q rows that sampled it, the probability that
standard verification accepts at least i drafts is prod_{j<=i} min(1, p_j(x_j)/q_j(x_j)),
so E[accepted | chain] = sum_i prod_{j<=i} min(1, p_j(x_j)/q_j(x_j)) exactly. Averaging
that over chains drawn the way the worker draws them, from contexts reached by running
real rounds, is an unbiased, low-variance estimate of the mean accepted length that the
daemons should measure for the same models and settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pp1q.core.prefix import Prefix
from pp1q.core.verify import RoundKeys, verify_round
from pp1q.models.toy import DraftModel, TargetModel
from pp1q.worker.proposer import ProposalSpec, propose

THEORY_SEED = 0x7E0  # fixed request seed of the estimate: the figure is reproducible


def expected_accepted(drafter: DraftModel, target: TargetModel, prompts: Sequence[Sequence[int]],
                      *, depth: int = 5, rounds_per_prompt: int = 8, temperature: float = 1.0,
                      top_k: int | None = None) -> tuple[float, float]:
    """(mean, standard error) of accepted drafts per round over the given prompts."""
    values = []
    for n, prompt in enumerate(prompts):
        prefix = Prefix(prompt)
        for r in range(rounds_per_prompt):
            spec = ProposalSpec(seed=THEORY_SEED + n, generation=0, round_id=r,
                                first_position=len(prefix), depth=depth, temperature=temperature,
                                top_k=top_k)
            chain = list(propose(drafter, prefix.tokens, spec))
            xs = [t for t, _ in chain]
            rows = [row for _, row in chain]
            p = target.probs(prefix.tokens, xs)
            survive, expect = 1.0, 0.0
            for i, (x, row) in enumerate(chain):
                q_x = row.count_of(x) / (1 << 24)
                survive *= min(1.0, float(p[i, x]) / q_x)
                expect += survive
            values.append(expect)
            keys = RoundKeys(THEORY_SEED + n, 0, r, len(prefix))
            d = verify_round(p, rows, xs, keys)
            prefix.extend(xs[: d.accepted] + [d.token])
    v = np.asarray(values)
    err = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else float("nan")
    return float(v.mean()), err
