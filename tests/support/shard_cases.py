"""Rounds for the sharded-sampler tests: fixed targets and draft chains, and helpers that
run one round over N simulated ranks (tests/kernels) or over gloo (tests/verifier/ranks)."""

from __future__ import annotations

import numpy as np
import torch

from pp1q.core.q import build_row, sample
from pp1q.core.rng import proposal_u24
from pp1q.core.verify import RoundKeys, round_draws
from pp1q_kernels import shard_step as ss
from pp1q_kernels.lookup import dense_counts, from_rows
from pp1q_kernels.shard_comm import ShardLayout
from pp1q_kernels.shard_spmd import Place, simulate

V, D = 53, 3
ONE = ShardLayout(V, ((0, V),))
SPLITS = [ShardLayout.cuts(V, [9]), ShardLayout.cuts(V, [30, 31])]  # uneven; a 1-id shard
ROUNDS = 600  # default run (~10 s on two cores); --runslow runs the 10^4
ROUNDS_SLOW = 10_000


class Case:
    """A fixed target and draft chain: logits [D+1, V], q rows, drafts (the q's own draws)."""

    def __init__(self, g, sparse: bool, adversarial: bool, close: bool = False) -> None:
        self.logits = torch.tensor(g.normal(0, 2.5, (D + 1, V)))
        ql = -self.logits[:D].numpy() if adversarial else g.normal(0, 2.5, (D, V))
        if close:  # a drafter near the target: long acceptances, bonus picks
            ql = self.logits[:D].numpy() + g.normal(0, 0.2, (D, V))
        self.rows = [build_row(ql[i], top_k=6 if sparse else None) for i in range(D)]
        seed = int(g.integers(0, 2**63))
        self.drafts = [sample(r, proposal_u24(seed, 1, 1, 10 + i)) for i, r in enumerate(self.rows)]
        self.sparse = sparse
        self.q_sparse = from_rows(self.rows)
        self.q_dense = dense_counts(self.q_sparse)
        self.p = simulate(ONE.bounds, lambda pl: ss.probs(pl, self.logits))[0]

    def q_for(self, pl: Place):
        return self.q_sparse if self.sparse else self.q_dense[:, pl.lo:pl.hi]


def cases(seed=7, n=24):
    g = np.random.default_rng(seed)
    return [Case(g, sparse=k % 2 == 0, adversarial=k % 3 == 0, close=k % 3 == 1)
            for k in range(n)]


def round_step(pl: Place, case: Case, keys: RoundKeys, q=None, temperature: float = 1.0,
               top_k=None, top_p=None):
    """One rank's step of a sampled round (``q``: this rank's q, default ``case.q_for``);
    the target processors as pp1q.verifier.ranks.sharded applies them (x / T first)."""
    ua, uc, ub = (np.asarray(u)[0] for u in round_draws([keys], D))
    return ss.sampled_round(pl, case.logits[:, pl.lo:pl.hi] / temperature,
                            case.q_for(pl) if q is None else q, torch.tensor(case.drafts),
                            torch.tensor(ua), torch.tensor(uc), int(ub), top_k, top_p)


def round_keys(k: int) -> RoundKeys:
    return RoundKeys(0x5EED + k * 7919, 1 + k % 5, k, 100 + k % 13)


def round_on(layout, case: Case, keys: RoundKeys, proc: dict | None = None, **kw):
    """``proc``: temperature / top_k / top_p for round_step."""
    out = simulate(layout.bounds, lambda pl: round_step(pl, case, keys, **(proc or {})), **kw)
    assert len(set(out)) == 1, out  # every rank returns the same decision
    return out[0]


def target_only_on(layout, case: Case, u53: int, proc: dict | None = None, **kw):
    proc = dict(proc or {})
    t = proc.pop("temperature", 1.0)
    out = simulate(layout.bounds, lambda pl: ss.target_only(
        pl, case.logits[0, pl.lo:pl.hi] / t, u53, **proc), **kw)
    assert len(set(out)) == 1
    return out[0]


def greedy_on(layout, case: Case, **kw):
    drafts = torch.tensor(case.drafts)
    out = simulate(layout.bounds, lambda pl: ss.greedy_round(
        pl, case.logits[:, pl.lo:pl.hi], drafts), **kw)
    assert len(set(out)) == 1
    return out[0]


