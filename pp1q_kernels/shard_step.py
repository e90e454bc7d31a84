"""The exact sampler on one rank of a vocabulary split: no rank holds a full row of p.

Each step is written from one rank's point of view over shard_spmd's collectives (it
yields requests; ``shard_spmd.drive`` runs it over torch.distributed, ``lockstep`` runs
N simulated ranks). A rank holds the target's logits for its ids [lo, hi) only, and q
either as its slice of dense counts or as a whole sparse row (small, broadcast).

Per sampled round of depth D (six collectives, none wider than max(D + 1, N) * 2, with
no top-k / top-p; shard_processors adds its own, which are as bounded):

1. p: each rank's row maxima are gathered (N x (D+1)); exp(x - global max) is summed
   as exact integer limbs (fixed.sum_limbs), all-reduced; p = e / total. The total is
   the same float on every rank and for any split, so p is bit-identical to the
   one-rank p (which is this function with N = 1).
2. P = floor(p * 2^61) (fixed.to_fixed); the target's top-k / top-p zero the P they
   drop, in exact integers (shard_processors); S = sum(P), all-reduced as int64.
3. The ratio test of draft x_i runs on the rank that owns x_i (its P_x, its q count:
   fixed.accepts_exact); its verdict (accept / reject / q = 0) reaches every rank in
   one all-reduce where only owners write. The first rejection decides.
4. The chosen row (the first rejection's, or the bonus row): each rank forms its
   residual R = max(P - Q, 0) (residual.apply_q, for every id it owns); one gather of
   N (residual mass, P mass) pairs; the keyed draw T = floor(u * W / 2^53) over the
   total W picks the rank by cumulative mass (a rank with no mass can never be first
   above T), and that rank picks inside its shard at T minus the mass before it
   (residual.pick_fixed). The id is broadcast from it.

That is the one-process pick (the smallest j with R_0 + ... + R_j > T) with the prefix
sums split at shard edges: the same integers, so the same id for every split. A
residual with no mass anywhere falls back to P with the same draw (flagged, as
verify_step does). Target-only and bonus picks are step 4 with no q; greedy rounds
gather (max logit, its id) per row.

Refusals are decided from values every rank sees (gathered maxima, totals, the owners'
verdicts), so all ranks refuse together, at the same collective, for the same reason.
"""

from __future__ import annotations

import math

import torch

from pp1q.core.errors import DistributionError, LocalProtocolError, Reason

from .counts import check_max, check_total
from .fixed import accepts_exact, check_totals, draw_threshold, limbs_to_float, sum_limbs, to_fixed
from .lookup import SparseCounts, count_at, restrict
from .proposal import first_above
from .residual import apply_q, pick_fixed
from .shard_processors import processed
from .shard_spmd import Bcast, Gather, Place, Step, Sum

ACCEPT, REJECT, ZERO_Q = 1, 2, 3  # an owner's verdict on one draft (0: not the owner)


def probs(place: Place, logits: torch.Tensor) -> Step:
    """p [n, width] of logits [n, width] (T = 1): global max, exact total, e / total."""
    x = logits.to(torch.float64)
    n = x.shape[0]
    local = x.amax(-1) if place.width else torch.full((n,), -math.inf, dtype=torch.float64)
    maxes = yield Gather(local)  # [N, n]; NaN and +inf show in some rank's max
    if bool(torch.isnan(maxes).any()):
        raise DistributionError(Reason.NAN_LOGIT, "NaN logit")
    if bool(torch.isposinf(maxes).any()):
        raise DistributionError(Reason.POSINF_LOGIT, "+inf logit")
    gmax = maxes.amax(0)
    check_max(gmax)
    e = torch.exp(x - gmax.unsqueeze(-1))
    limbs = yield Sum(torch.stack(sum_limbs(e), -1))  # [n, 2]: exact in any split
    total = limbs_to_float(limbs[:, 0], limbs[:, 1])
    check_total(total)
    return e / total.unsqueeze(-1)


def _local_q(place: Place, q, i: int):
    """This rank's q row i in local ids: a dense slice already, or a sparse row cut."""
    if isinstance(q, SparseCounts):
        return restrict(q.index(slice(i, i + 1)), place.lo, place.hi)
    return q[i:i + 1].to(torch.int64)


def _count_at(place: Place, q, i: int, token: int) -> int:
    if isinstance(q, SparseCounts):
        return int(count_at(q.index(i), torch.tensor(token)))
    return int(q[i, token - place.lo])


def _verdicts(place: Place, P, S, q, drafts, u_acc) -> torch.Tensor:
    """Owner verdicts [D] of this rank (0 where another rank owns the draft)."""
    D = drafts.shape[0]
    out = torch.zeros(D, dtype=torch.int64)
    for i in range(D):
        x = int(drafts[i])
        if not place.lo <= x < place.hi:
            continue
        c = _count_at(place, q, i, x)
        if c <= 0:
            out[i] = ZERO_Q
            continue
        ok = accepts_exact(u_acc[i:i + 1].to(torch.int64), torch.tensor([c]),
                           P[i, x - place.lo].reshape(1), S[i:i + 1])
        out[i] = ACCEPT if bool(ok) else REJECT
    return out


def pick(place: Place, R: torch.Tensor, fallback: torch.Tensor, u53: int) -> Step:
    """(global id, underflow) of the keyed inverse-CDF pick over rows split by rank.

    R [width] int64: this rank's weights; ``fallback`` [width]: its P row, used by every
    rank alike when no rank has residual mass."""
    mine = torch.stack([R.sum(), fallback.sum()]).to(torch.int64)
    masses = yield Gather(mine)  # [N, 2]: one gather of N (residual, p) masses
    under = bool(masses[:, 0].sum() == 0)
    W = masses[:, 1] if under else masses[:, 0]
    if under:
        R = fallback
    total = W.sum()
    if not 0 < int(total) < (1 << 62):
        raise DistributionError(Reason.ZERO_MASS, "target row has no mass at 2^-61")
    cum = W.cumsum(0)
    thr = draw_threshold(torch.tensor(u53, dtype=torch.int64), total)
    owner = int(first_above(cum, thr))
    token = torch.full((1,), -1, dtype=torch.int64)
    if owner == place.rank:
        local = (thr - (cum[owner] - W[owner])).reshape(1)
        token[0] = int(pick_fixed(R.reshape(1, -1), local)[0]) + place.lo
    token = yield Bcast(token, owner)
    t = int(token[0])
    if not 0 <= t < place.vocab:  # unreachable by construction; never hand it out
        raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, "pick fell past the last id")
    return t, under


def sampled_round(place: Place, logits: torch.Tensor, q, drafts: torch.Tensor,
                  u_acc: torch.Tensor, u_corr: torch.Tensor, u_bonus: int,
                  top_k: int | None = None, top_p: float | None = None) -> Step:
    """(accepted, token, underflow) of one round: logits [D+1, width] of this rank's ids,
    q dense counts [D, width] (this rank's slice) or SparseCounts [D, K] (global ids),
    drafts [D] global ids, the round's draws (pp1q.core.verify.round_draws); the target's
    top-k / top-p apply to every row (shard_processors), as to a target-only pick."""
    D = int(drafts.shape[0])
    if D < 1 or tuple(logits.shape) != (D + 1, place.width):
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "need D drafts and D+1 logit rows")
    if int(drafts.min()) < 0 or int(drafts.max()) >= place.vocab:
        raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, "draft id outside vocab")
    p = yield from probs(place, logits)
    P = yield from processed(place, to_fixed(p), top_k, top_p)
    S = yield Sum(P.sum(-1))  # [D+1] exact row totals (of the kept ids)
    check_totals(S)
    verdicts = yield Sum(_verdicts(place, P, S, q, drafts, u_acc))
    if bool(((verdicts < ACCEPT) | (verdicts > ZERO_Q)).any()):
        raise LocalProtocolError(Reason.OUT_OF_ORDER, f"draft verdicts {verdicts.tolist()}")
    if bool((verdicts == ZERO_Q).any()):
        raise LocalProtocolError(Reason.ZERO_Q_AT_TOKEN, "a drafted token has q = 0")
    rejected = (verdicts == REJECT).nonzero()
    j = int(rejected[0]) if rejected.numel() else D
    if j < D:
        R = apply_q(P[j:j + 1].clone(), S[j:j + 1], _local_q(place, q, j))[0]
        u = int(u_corr[j])
    else:
        R, u = P[D], int(u_bonus)
    token, under = yield from pick(place, R, P[j], u)
    return j, token, under


def target_only(place: Place, logits: torch.Tensor, u53: int,
                top_k: int | None = None, top_p: float | None = None) -> Step:
    """One id from p alone (the TARGET_ONLY draw) after the same processors as a round:
    logits [width]."""
    p = yield from probs(place, logits.reshape(1, -1))
    P = (yield from processed(place, to_fixed(p), top_k, top_p))[0]
    token, _ = yield from pick(place, P, P, u53)
    return token


def argmax(place: Place, logits: torch.Tensor) -> Step:
    """Global argmax ids [n] of logits rows [n, width] (ties: lowest id, as np.argmax)."""
    n = logits.shape[0]
    x = logits.to(torch.float64)
    if place.width:
        best, at = x.max(-1)
        mine = torch.stack([best, (at + place.lo).to(torch.float64)], -1)
    else:
        mine = torch.stack([torch.full((n,), -math.inf), torch.zeros(n)], -1).double()
    every = yield Gather(mine)  # [N, n, 2]; ids < 2^53 are exact in float64
    vals = every[..., 0]
    top = vals.amax(0)
    first = (vals == top).to(torch.int64).argmax(0)  # lowest rank holding the max
    return every[first, torch.arange(n), 1].to(torch.int64)


def greedy_round(place: Place, logits: torch.Tensor, drafts: torch.Tensor) -> Step:
    """(accepted, token): accept while draft == the target's argmax (v1 greedy)."""
    best = yield from argmax(place, logits)
    accepted = 0
    while accepted < drafts.shape[0] and int(drafts[accepted]) == int(best[accepted]):
        accepted += 1
    return accepted, int(best[accepted])
