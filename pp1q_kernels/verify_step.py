"""The batched standard-verification step over [requests, depth] (kernel 6).

docs/distribution.md, for B requests at once, each with its own keys (seed, generation,
round, first_position): acceptance draws for every (request, position), exact ratio tests
(``fixed.accepts_exact`` on the normalised fixed-point p), the first rejection, then one
residual pick (correction) or target pick (bonus) per request (``residual.py``).
Decisions equal the rational oracle's for the same draws whenever the fixed-point rows
are exact (every float32 p entry >= 2^-38 or 0), and differ at most at boundaries
within about K * 2^-61 of a row's mass otherwise (docs/kernels.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.rng import Domain
from pp1q.core.verify import RoundDecision, RoundKeys

from .fixed import accepts_exact, block_sums, check_target, check_totals, to_fixed
from .lookup import SparseCounts, count_at
from .philox import MAX_GENERATION, keyed_u53, seed_tensor
from .residual import BLOCK, sample_fixed


@dataclass(frozen=True)
class StepKeys:
    """Per-request keys as int64 tensors [B] (seeds two's-complement). The seeds are the
    verifier's draw seeds (pp1q.core.drawkey: ``DrawKeys.seed_for(request seed)``), never
    the seed a STEP carries: a decider builds its RoundKeys with them."""

    seeds: torch.Tensor
    generation: torch.Tensor
    round_id: torch.Tensor
    first_position: torch.Tensor

    @classmethod
    def from_keys(cls, keys: Sequence[RoundKeys], device=None) -> StepKeys:
        def col(name):
            return torch.tensor([getattr(k, name) for k in keys], dtype=torch.int64, device=device)

        return cls(seed_tensor([k.seed for k in keys], device), col("generation"),
                   col("round_id"), col("first_position"))


@dataclass(frozen=True)
class StepResult:
    accepted: torch.Tensor  # [B] drafts accepted (== depth: the token is the bonus)
    token: torch.Tensor  # [B] correction or bonus id, always < vocab
    underflow: torch.Tensor  # [B] residual had no mass: picked from p (counted by callers)

    def decisions(self, depth: int) -> list[RoundDecision]:
        return [
            RoundDecision(a, t, "bonus" if a == depth else "correction", u)
            for a, t, u in zip(self.accepted.tolist(), self.token.tolist(),
                               self.underflow.tolist(), strict=True)
        ]


def step_draws(keys: StepKeys, depth: int):
    """(acceptance [B, D], correction [B, D], bonus [B]) 53-bit draws, per-request keys."""
    key = (keys.seeds.unsqueeze(-1), keys.generation.unsqueeze(-1), keys.round_id.unsqueeze(-1))
    pos = keys.first_position.unsqueeze(-1) + torch.arange(depth, device=keys.first_position.device)
    return (
        keyed_u53(*key, pos, Domain.ACCEPTANCE),
        keyed_u53(*key, pos, Domain.CORRECTION),
        keyed_u53(keys.seeds, keys.generation, keys.round_id, keys.first_position + depth,
                  Domain.BONUS),
    )


def check_keys(keys: StepKeys, depth: int) -> None:
    """Key fields within their bit widths (pp1q.core.rng), before any kernel reads them."""
    top = (1 << 32) - 1
    fields = [("generation", keys.generation, MAX_GENERATION), ("round", keys.round_id, top),
              ("position", keys.first_position + depth, top),
              ("position", keys.first_position, top)]
    for name, t, hi in fields:
        if t.numel() and (int(t.min()) < 0 or int(t.max()) > hi):
            raise LocalProtocolError(Reason.RNG_KEY_OUT_OF_RANGE, f"{name} outside [0, {hi}]")


def check_shapes(p, q, draft) -> None:
    B, D1, V = p.shape
    q_lead = q.ids.shape[:-1] if isinstance(q, SparseCounts) else q.shape[:-1]
    q_vocab = q.vocab if isinstance(q, SparseCounts) else q.shape[-1]
    shape_ok = D1 >= 2 and tuple(draft.shape) == (B, D1 - 1) == tuple(q_lead)
    if not shape_ok or q_vocab != V:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "p, q and draft shapes disagree")
    if draft.numel() and (int(draft.min()) < 0 or int(draft.max()) >= V):
        raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, "draft id outside vocab")


def check_drafted(c_x: torch.Tensor) -> torch.Tensor:
    if c_x.numel() and int(c_x.min()) <= 0:
        raise LocalProtocolError(Reason.ZERO_Q_AT_TOKEN, "a drafted token has q = 0")
    return c_x


def first_rejection(u_acc, c_x, p_x, s_total) -> torch.Tensor:
    """Accepted drafts per request [B]: index of the first failed ratio test, else D."""
    rejected = ~accepts_exact(u_acc.to(torch.int64), c_x, p_x, s_total)
    depth = rejected.shape[-1]
    return torch.where(rejected.any(-1), rejected.to(torch.int64).argmax(-1), depth)


def chosen_rows(q, accepted, u_corr, u_bonus):
    """(q rows [B], use_q [B], draw [B]) for each request's correction or bonus pick."""
    depth = u_corr.shape[-1]
    use_q = accepted < depth
    qi = accepted.clamp(max=depth - 1)
    b = torch.arange(accepted.shape[0], device=accepted.device)
    q_rows = q.index(b, qi) if isinstance(q, SparseCounts) else q[b, qi]
    u = torch.where(use_q, u_corr.gather(-1, qi.unsqueeze(-1)).squeeze(-1), u_bonus)
    return q_rows, use_q, u


@dataclass(frozen=True)
class FixedRows:
    """Target rows in fixed point, ready for ``decide_fixed``: P [B, D+1, V] int64, its
    block sums [B, D+1, V / BLOCK] and row totals S [B, D+1]."""

    P: torch.Tensor
    psums: torch.Tensor
    s_total: torch.Tensor

    @classmethod
    def of(cls, p: torch.Tensor, *, validate=True, out: torch.Tensor | None = None) -> FixedRows:
        """From float rows p [B, D+1, V] (checked first when ``validate``); ``out``: a
        reused int64 buffer of p's shape for P."""
        if validate:
            check_target(p)
        return cls.of_fixed(to_fixed(p, out), validate=validate)

    @classmethod
    def of_fixed(cls, P: torch.Tensor, *, validate=True) -> FixedRows:
        """From P = to_fixed(p) [B, D+1, V] (each p checked by the caller)."""
        B, D1, V = P.shape
        psums = block_sums(P.view(B * D1, V), BLOCK).view(B, D1, -1)
        s_total = psums.sum(-1)
        if validate:
            check_totals(s_total)
        return cls(P, psums, s_total)


def decide(p, q, draft, u_acc, u_corr, u_bonus, *, validate=True) -> StepResult:
    """The step with explicit draws. p [B, D+1, V] float; q dense [B, D, V] or sparse."""
    return decide_fixed(FixedRows.of(p, validate=validate), q, draft, u_acc, u_corr, u_bonus)


def decide_fixed(rows: FixedRows, q, draft, u_acc, u_corr, u_bonus) -> StepResult:
    """``decide`` on target rows already in fixed point (not modified)."""
    P, psums, s_total = rows.P, rows.psums, rows.s_total
    draft = draft.to(torch.int64)
    check_shapes(P, q, draft)
    B, D1, V = P.shape
    D = D1 - 1
    c_x = check_drafted(count_at(q, draft))
    p_x = P[:, :D].gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    accepted = first_rejection(u_acc, c_x, p_x, s_total[:, :D])
    b = torch.arange(B, device=P.device)
    q_rows, use_q, u = chosen_rows(q, accepted, u_corr, u_bonus)
    token, under = sample_fixed(P[b, accepted], s_total[b, accepted], q_rows, u, use_q=use_q,
                                psums=psums[b, accepted],
                                fresh=lambda rows: P[rows, accepted[rows]])
    return StepResult(accepted, token, under)


def verify_step(p, q, draft, keys: StepKeys, *, validate=True) -> StepResult:
    """One fixed-depth round for every request, draws keyed per request."""
    check_keys(keys, p.shape[1] - 1)
    u_acc, u_corr, u_bonus = step_draws(keys, p.shape[1] - 1)
    return decide(p, q, draft, u_acc, u_corr, u_bonus, validate=validate)
