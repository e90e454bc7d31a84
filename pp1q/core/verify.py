"""Standard verification of one fixed-depth round, float64 numpy: the library's reference
path (selfcheck, theory, bench baselines; the verifier decides with pp1q_kernels).

Follows docs/distribution.md exactly; pp1q.core.reference is the rational oracle it is
qualified against (tests/core/test_verify.py). Batched over requests: acceptance tests for
every (request, position) at once, then one correction or bonus pick per request.

Implicit normalisation: p rows need not sum to exactly 1. With P = sum(p_i) (float64),
the round uses p_i / P without dividing the row: the ratio test is u < p(x) / (q(x) P),
the residual is max(p - q P, 0) and inverse-CDF picks scale the draw by the row total.

Tie rule (measure-zero boundaries, shared with the oracle): acceptance is strict,
U = u53 / 2^53 < ratio (equality rejects, so p(x) = 0 is never accepted, even with
u53 = 0); a pick takes the smallest id j with C_j > U * W (equality moves on to the next
id with positive weight, so a zero-weight id is never picked and the result is always
< vocab). Float64 rounding can move a boundary by a few ulps; the two implementations
may then disagree for draws within that distance of it (probability about 2^-50 per
decision), never elsewhere.

Residual underflow: when rejecting, the exact residual mass is always positive, but the
float64 residual max(p - qP, 0) can round to all zeros when p and q differ only in the
last bits. The correction is then picked from p_i itself with the same correction draw
and ``RoundDecision.residual_underflow`` is True; callers count it (it is not silent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pp1q.core.errors import DistributionError, LocalProtocolError, Reason
from pp1q.core.q import MASS, DyadicRow
from pp1q.core.rng import Domain, pack_counter, pack_key, philox4x32_10, u53_from_words, uniform53

_TWO_M53 = 2.0**-53
_TWO_77 = 2.0**77  # 2^53 (acceptance draw scale) * 2^24 (count scale)
_INV_MASS = 1.0 / MASS  # exact: a power of two


@dataclass(frozen=True)
class RoundKeys:
    """Everything that keys a round's draws; ``first_position`` is the absolute position of x_1.

    ``seed`` is the Philox key of the domains being drawn: the request seed for PROPOSAL
    (what the STEP carries; rounds.proposal_matches), the verifier's draw seed for
    ACCEPTANCE, CORRECTION, BONUS and TARGET_ONLY (pp1q.core.drawkey; the deciders)."""

    seed: int
    generation: int
    round_id: int
    first_position: int


@dataclass(frozen=True)
class RoundDecision:
    """Outcome of one round: ``accepted`` drafts, then ``token`` (kind correction/bonus)."""

    accepted: int
    token: int
    kind: str  # "correction" | "bonus"
    residual_underflow: bool = False


# ---------------------------------------------------------------------------
# keyed draws, vectorised over requests and positions


def round_draws(keys: Sequence[RoundKeys], depth: int):
    """(acceptance [B, D], correction [B, D], bonus [B]) 53-bit integer draws.

    Position of x_i is first_position + i - 1; the bonus is drawn at first_position + depth.
    """
    seeds = np.stack([pack_key(k.seed) for k in keys])[:, None, :]
    gen = np.array([k.generation for k in keys], dtype=np.int64)[:, None]
    rnd = np.array([k.round_id for k in keys], dtype=np.int64)[:, None]
    pos = np.array([k.first_position for k in keys], dtype=np.int64)[:, None] + np.arange(depth + 1)

    # one Philox call for all three domains: [B, 2D+1] counters side by side
    counters = np.concatenate([
        pack_counter(gen, rnd, pos[:, :depth], Domain.ACCEPTANCE),
        pack_counter(gen, rnd, pos[:, :depth], Domain.CORRECTION),
        pack_counter(gen, rnd, pos[:, depth:], Domain.BONUS),
    ], axis=1)
    u = u53_from_words(philox4x32_10(counters, seeds))
    return u[:, :depth], u[:, depth: 2 * depth], u[:, 2 * depth]


# ---------------------------------------------------------------------------
# q rows as the decision core sees them


class RowListQ:
    """q given as B lists of D DyadicRows (what the verifier receives)."""

    def __init__(self, rows: Sequence[Sequence[DyadicRow]], vocab: int) -> None:
        self.rows = rows
        self.vocab = vocab
        for chain in rows:
            for row in chain:
                if row.vocab != vocab:
                    raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "q vocab differs from p")

    def count_at(self, draft_ids: np.ndarray) -> np.ndarray:
        """Counts of the drafted tokens [B, D]; each must be positive (validated)."""
        out = np.empty(draft_ids.shape, dtype=np.int64)
        for b, chain in enumerate(self.rows):
            for i, row in enumerate(chain):
                out[b, i] = row.require_token(int(draft_ids[b, i]))
        return out

    def dense(self, b: np.ndarray, i: np.ndarray) -> np.ndarray:
        """Dense float64 counts of rows (b[n], i[n]) -> [n, V]."""
        out = np.zeros((b.size, self.vocab), dtype=np.float64)
        for n, (bb, ii) in enumerate(zip(b.tolist(), i.tolist(), strict=True)):
            row = self.rows[bb][ii]
            out[n, row.ids] = row.counts
        return out


class DenseQ:
    """q given as a dense count array [B, D, V] (a broadcast view is fine: never written)."""

    def __init__(self, counts: np.ndarray) -> None:
        self.counts = counts
        self.vocab = counts.shape[-1]

    def count_at(self, draft_ids: np.ndarray) -> np.ndarray:
        b = np.arange(draft_ids.shape[0])[:, None]
        i = np.arange(draft_ids.shape[1])[None, :]
        c = np.asarray(self.counts[b, i, draft_ids], dtype=np.int64)
        if c.size and int(c.min()) <= 0:
            raise LocalProtocolError(Reason.ZERO_Q_AT_TOKEN, "a drafted token has q = 0")
        return c

    def dense(self, b: np.ndarray, i: np.ndarray) -> np.ndarray:
        return np.asarray(self.counts[b, i], dtype=np.float64)


# ---------------------------------------------------------------------------
# the decision core


def _residual_weights(p: np.ndarray, q_counts: np.ndarray, total: np.ndarray) -> np.ndarray:
    """max(p - q * P, 0) over the full vocabulary, rows [n, V] (q = 0 outside a support)."""
    return np.maximum(p - q_counts * (total * _INV_MASS)[:, None], 0.0)


def pick(weights: np.ndarray, u53: np.ndarray) -> np.ndarray:
    """Inverse-CDF picks over rows [n, V] with positive totals: smallest j, C_j > U * W."""
    cum = np.cumsum(weights, axis=1)
    thr = (np.asarray(u53, dtype=np.float64) * _TWO_M53) * cum[:, -1]
    idx = np.count_nonzero(cum <= thr[:, None], axis=1)
    # thr < W always holds in float64 (see the tie rule); keep the id in range regardless.
    if (idx >= weights.shape[1]).any():
        raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, "pick fell past the last id")
    return idx


def _check_p(p: np.ndarray) -> np.ndarray:
    total = p.sum(axis=-1)
    if not np.isfinite(total).all():
        raise DistributionError(Reason.NON_FINITE, "target row is not finite")
    if not (total > 0).all():
        raise DistributionError(Reason.ZERO_MASS, "target row has no mass")
    if not p.min(initial=0.0) >= 0:
        raise DistributionError(Reason.NEGATIVE_VALUE, "negative target probability")
    return total


def decide(p, q, draft_ids, u_acc, u_corr, u_bonus):
    """The round for B requests with explicit draws.

    p [B, D+1, V] float64; q a ``RowListQ``/``DenseQ``; draft_ids, u_acc, u_corr [B, D];
    u_bonus [B]. Returns (accepted [B], token [B], underflow [B]) arrays.
    """
    p = np.asarray(p, dtype=np.float64)
    draft_ids = np.asarray(draft_ids, dtype=np.int64)
    if p.ndim != 3 or p.shape[1] < 2:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "p must be [B, D+1, V] with D >= 1")
    B, D1, V = p.shape
    D = D1 - 1
    if draft_ids.shape != (B, D) or q.vocab != V:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "p, q and draft shapes disagree")
    if draft_ids.size and (int(draft_ids.min()) < 0 or int(draft_ids.max()) >= V):
        raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, "draft id outside vocab")
    total = _check_p(p)
    rows = np.arange(B)
    c_x = q.count_at(draft_ids)
    p_x = p[rows[:, None], np.arange(D)[None, :], draft_ids]
    # accept iff u53 < (p(x) / P) * 2^77 / c(x), i.e. U < p(x) / (q(x) P), strict;
    # the 2^77 scaling is exact, so with P = 1 only the division by c(x) rounds.
    thresh = ((p_x / total[:, :D]) * _TWO_77) / c_x
    rejected = ~(np.asarray(u_acc, dtype=np.float64) < thresh)
    any_rej = rejected.any(axis=1)
    accepted = np.where(any_rej, rejected.argmax(axis=1), D)

    token = np.empty(B, dtype=np.int64)
    underflow = np.zeros(B, dtype=bool)
    rej = np.flatnonzero(any_rej)
    if rej.size:
        i = accepted[rej]
        p_rej = p[rej, i]
        w = _residual_weights(p_rej, q.dense(rej, i), total[rej, i])
        under = ~(w.sum(axis=1) > 0)
        w[under] = p_rej[under]
        underflow[rej] = under
        token[rej] = pick(w, np.asarray(u_corr)[rej, i])
    bon = np.flatnonzero(~any_rej)
    if bon.size:
        token[bon] = pick(p[bon, D], np.asarray(u_bonus)[bon])
    return accepted, token, underflow


# ---------------------------------------------------------------------------
# public entry points


def verify_batch(p_rows, q_rows, draft_ids, keys: Sequence[RoundKeys]) -> list[RoundDecision]:
    """Standard verification of B rounds (same depth >= 1), each with its own keys."""
    if len(keys) == 0 and len(q_rows) == 0 and len(draft_ids) == 0:
        return []
    p = np.asarray(p_rows, dtype=np.float64)
    if p.ndim != 3 or len(q_rows) != p.shape[0] or len(keys) != p.shape[0]:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "batch sizes disagree")
    depth = p.shape[1] - 1
    if depth < 1:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "a round drafts at least one token")
    if any(len(chain) != depth for chain in q_rows) or len(draft_ids) != p.shape[0] or any(
        len(chain) != depth for chain in draft_ids
    ):
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "need one q row and draft per position")
    u_acc, u_corr, u_bonus = round_draws(keys, depth)
    drafts = np.asarray(draft_ids, dtype=np.int64).reshape(p.shape[0], depth)
    accepted, token, under = decide(
        p, RowListQ(q_rows, p.shape[2]), drafts, u_acc, u_corr, u_bonus
    )
    return [
        RoundDecision(int(a), int(t), "bonus" if a == depth else "correction", bool(u))
        for a, t, u in zip(accepted, token, under, strict=True)
    ]


def verify_round(p_rows, q_rows, draft_ids, keys: RoundKeys) -> RoundDecision:
    """One round: p_rows [D+1, V] (p_{D+1} for the bonus), D q rows, D draft ids."""
    p = np.asarray(p_rows, dtype=np.float64)
    return verify_batch(p[None], [list(q_rows)], [list(draft_ids)], [keys])[0]


def target_only_token(p, keys: RoundKeys, position: int) -> int:
    """Target-only step producing absolute ``position``: TARGET_ONLY draw, inverse-CDF."""
    row = np.asarray(p, dtype=np.float64)
    if row.ndim != 1:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "target-only needs one row")
    _check_p(row[None])
    return int(pick(row[None], np.array([target_only_draw(keys, position)]))[0])


def target_only_draw(keys: RoundKeys, position: int) -> int:
    """The 53-bit TARGET_ONLY draw of the step producing absolute ``position``."""
    return uniform53(keys.seed, keys.generation, keys.round_id, position, Domain.TARGET_ONLY)
