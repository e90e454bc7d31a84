"""Sharding emulator: each kernel with the vocabulary split over N = 1..4 ranks.

Every rank runs the same rank-local functions as the unsharded kernels on its slice of
the vocabulary; the only cross-rank traffic is through ``Collectives`` (all-reduce,
all-gather of per-rank scalars or top-k candidates, broadcast of a decision), never a
full-vocabulary gather. Because every kernel is exact integer arithmetic (or exact
comparisons), the sharded results are bit-identical to the unsharded ones:

- counts: global max, exact limb sums and the remainder threshold (bisection over
  all-reduced counts) are the same numbers, ties go to the lowest global id;
- proposal and residual: one leader draw picks the shard by its integer mass and the
  remaining threshold picks the token inside it: the same inverse-CDF pick;
- verify: the owner rank supplies p(x) and q(x); every decision is made once.

``residual(..., second=...)`` is the seed's literal two-draw form (the owner rank uses
its own keyed draw inside the chosen shard): equal in distribution, not in ids, and
tested by chi-square. ``shard_by="p_mass"`` is a planted bug for that test.
"""

from __future__ import annotations

import torch

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.q import MASS

from .counts import (
    check_max,
    check_remaining,
    check_total,
    floors,
    scaled_logits,
    support_counts,
    ticket_mask,
)
from .fixed import (
    SUM_MAX_ENTRIES,
    check_target,
    check_totals,
    draw_threshold,
    limbs_to_float,
    sum_limbs,
    to_fixed,
)
from .lookup import SparseCounts, count_at, dense_counts, shard_q
from .proposal import check_draws, first_above, local_mass, sample_counts
from .residual import apply_q, pick_fixed
from .shard_comm import Collectives, ShardLayout
from .topk import local_topk, select_positions
from .verify_step import (
    StepKeys,
    StepResult,
    check_drafted,
    check_keys,
    check_shapes,
    chosen_rows,
    first_rejection,
    step_draws,
)

_KEY_TOP = 1 << 62  # above the IEEE bits of every fractional remainder (< 1.0)
_BISECT_STEPS = 62


def _rows(q, rows: torch.Tensor):
    return q.index(rows) if isinstance(q, SparseCounts) else q[rows]


def _owner_picks(layout: ShardLayout, comm: Collectives, owner, pick_local) -> torch.Tensor:
    """Each rank picks (local id) for the rows it owns; the ids are broadcast."""
    comm.broadcast(owner)
    ids = torch.full_like(owner, -1)
    for s, (lo, _) in enumerate(layout.bounds):
        rows = (owner == s).nonzero().squeeze(-1)
        if rows.numel():
            ids[rows] = pick_local(s, rows) + lo
    return comm.broadcast(ids)


# ---------------------------------------------------------------------------
# kernel 1: global logsumexp weights and counts


def weights(layout, comm, logits, temperature=1.0) -> list[torch.Tensor]:
    """Per-rank normalised FP64 weights: all-reduce max, then exact limb sums."""
    if layout.vocab > SUM_MAX_ENTRIES:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "vocabulary too large for exact sums")
    xs, local_max = zip(*(scaled_logits(x, temperature) for x in layout.split(logits)),
                        strict=True)
    gmax = comm.all_reduce_max(list(local_max))
    check_max(gmax)
    es = [torch.exp(x - gmax) for x in xs]
    limbs = comm.all_reduce_sum([torch.stack(sum_limbs(e)) for e in es])
    total = limbs_to_float(limbs[0], limbs[1]).unsqueeze(-1)
    check_total(total)
    return [e / total for e in es]


def _bisect(comm, keys, remaining) -> torch.Tensor:
    """The remaining-th largest key over all ranks (all-reduced counts per step)."""
    lo = torch.zeros_like(remaining)
    hi = torch.full_like(remaining, _KEY_TOP)
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) >> 1
        cnt = comm.all_reduce_sum([(k >= mid.unsqueeze(-1)).sum(-1) for k in keys])
        take = cnt >= remaining
        lo, hi = torch.where(take, mid, lo), torch.where(take, hi, mid)
    return torch.where(remaining > 0, lo, _KEY_TOP)


def counts(layout, comm, logits, temperature=1.0, top_k=None):
    """Dense counts [R, V] (or SparseCounts with top_k), tickets coordinated globally."""
    ws = weights(layout, comm, logits, temperature)
    if top_k is not None:
        ids, vals = _merged_topk(layout, comm, ws, top_k)
        result = support_counts(vals, ids, layout.vocab)  # on the leader
        comm.broadcast(result.ids)
        return result
    parts = [floors(w) for w in ws]
    remaining = MASS - comm.all_reduce_sum([fl.sum(-1) for fl, _, _ in parts])
    check_remaining(remaining, comm.all_reduce_sum([el for _, _, el in parts]))
    # IEEE bits of non-negative doubles order like their values: exact integer keys
    keys = [torch.where(k >= 0, k.view(torch.int64), -1) for _, k, _ in parts]
    kth = _bisect(comm, keys, remaining)
    above = comm.all_reduce_sum([(k > kth.unsqueeze(-1)).sum(-1) for k in keys])
    ties = comm.all_gather([(k == kth.unsqueeze(-1)).sum(-1) for k in keys])
    before = ties.cumsum(-1) - ties  # ties held by lower-id ranks
    out = [fl + ticket_mask(k, kth, remaining, before[..., s], above).to(torch.int64)
           for s, ((fl, _, _), k) in enumerate(zip(parts, keys, strict=True))]
    return torch.cat(out, -1)


# ---------------------------------------------------------------------------
# kernel 2: global top-k merge


def _merged_topk(layout, comm, ws, k):
    cands = [local_topk(w, k, lo) for w, (lo, _) in zip(ws, layout.bounds, strict=True)]
    vals = torch.cat(comm.all_gather_list([v for v, _ in cands]), -1)
    ids = torch.cat(comm.all_gather_list([i for _, i in cands]), -1)
    pos = select_positions(vals, min(k, vals.shape[-1]))
    return ids.gather(-1, pos), vals.gather(-1, pos)


def topk(layout, comm, w, k) -> torch.Tensor:
    """Global top-k ids of weight rows [R, V] from per-rank candidates."""
    return comm.broadcast(_merged_topk(layout, comm, layout.split(w), k)[0])


# ---------------------------------------------------------------------------
# kernels 3 and 4: proposal and sparse lookup


def propose(layout, comm, q, u24) -> torch.Tensor:
    """One leader draw: the shard by its count mass, then the token inside it."""
    u24 = check_draws(u24)
    qs = [shard_q(q, lo, hi) for lo, hi in layout.bounds]
    mass = comm.all_gather([local_mass(x) for x in qs])  # [R, N]
    cum = mass.cumsum(-1)
    owner = first_above(cum, u24)
    local_u = u24 - (cum - mass).gather(-1, owner.unsqueeze(-1)).squeeze(-1)
    comm.broadcast(local_u)
    return _owner_picks(layout, comm, owner,
                        lambda s, rows: sample_counts(_rows(qs[s], rows), local_u[rows]))


def lookup(layout, comm, q, tokens) -> torch.Tensor:
    """q counts at global tokens [...]: the owner rank answers, an all-reduce delivers."""
    owner = layout.owner(tokens)
    parts = []
    for s, (lo, hi) in enumerate(layout.bounds):
        local = (tokens - lo).clamp(0, hi - lo - 1)
        parts.append(torch.where(owner == s, count_at(shard_q(q, lo, hi), local), 0))
    return comm.all_reduce_sum(parts)


def scatter(layout, q) -> torch.Tensor:
    """Dense counts assembled from each rank's own entries (no communication)."""
    return torch.cat([dense_counts(shard_q(q, lo, hi)) for lo, hi in layout.bounds], -1)


# ---------------------------------------------------------------------------
# kernel 5: residual mass and sampling


def residual(layout, comm, p, q, u53, *, use_q=None, second=None, shard_by="residual"):
    """Ids [n] and underflow flags [n] for rows p [n, V]; q dense/sparse/None.

    ``second``: per-row draws for the two-draw form (owner's own draw in the shard).
    ``shard_by="p_mass"``: planted bug, the shard chosen by its p mass, not residual.
    """
    check_target(p)
    ps = layout.split(p)
    Ps = [to_fixed(x) for x in ps]
    p_mass = comm.all_gather([P.sum(-1) for P in Ps])
    s_total = p_mass.sum(-1)
    check_totals(s_total)
    Rs = [apply_q(P, s_total, None if q is None else shard_q(q, lo, hi), use_q)
          for P, (lo, hi) in zip(Ps, layout.bounds, strict=True)]
    masses = comm.all_gather([R.sum(-1) for R in Rs])  # [n, N]
    under = masses.sum(-1) == 0
    if bool(under.any()):  # every rank falls back to its p slice for those rows
        rows = under.nonzero().squeeze(-1)
        for R, x in zip(Rs, ps, strict=True):
            R[rows] = to_fixed(x[rows])
        masses = comm.all_gather([R.sum(-1) for R in Rs])
    choose = masses
    if shard_by == "p_mass":  # the planted bug (shards without residual stay impossible)
        choose = torch.where(masses > 0, p_mass, 0)
    cum = choose.cumsum(-1)
    thr = draw_threshold(u53.to(torch.int64), cum[..., -1])
    owner = first_above(cum, thr)
    if second is None:
        local = thr - (cum - choose).gather(-1, owner.unsqueeze(-1)).squeeze(-1)
    else:
        own = masses.gather(-1, owner.unsqueeze(-1)).squeeze(-1)
        local = draw_threshold(second.to(torch.int64), own)
    comm.broadcast(local)
    ids = _owner_picks(layout, comm, owner, lambda s, rows: pick_fixed(Rs[s][rows], local[rows]))
    return ids, under


# ---------------------------------------------------------------------------
# kernel 6: the verification step


def verify(layout, comm, p, q, draft, keys: StepKeys) -> StepResult:
    """The batched step with p [B, D+1, V] and q split over ranks; decisions made once."""
    draft = draft.to(torch.int64)
    check_shapes(p, q, draft)
    depth = p.shape[1] - 1
    check_keys(keys, depth)
    check_target(p)
    Ps = [to_fixed(x) for x in layout.split(p)]
    s_total = comm.all_reduce_sum([P.sum(-1) for P in Ps])
    check_totals(s_total)
    c_x = check_drafted(lookup(layout, comm, q, draft))
    owner = layout.owner(draft)
    p_x = comm.all_reduce_sum([
        torch.where(owner == s, P[:, :depth].gather(-1, (draft - lo).clamp(0, hi - lo - 1)
                                                    .unsqueeze(-1)).squeeze(-1), 0)
        for s, (P, (lo, hi)) in enumerate(zip(Ps, layout.bounds, strict=True))
    ])
    u_acc, u_corr, u_bonus = step_draws(keys, depth)
    accepted = comm.broadcast(first_rejection(u_acc, c_x, p_x, s_total[:, :depth]))
    q_rows, use_q, u = chosen_rows(q, accepted, u_corr, u_bonus)
    b = torch.arange(p.shape[0], device=p.device)
    token, under = residual(layout, comm, p[b, accepted], q_rows, u, use_q=use_q)
    return StepResult(accepted, token, under)


KERNELS = {
    "counts": counts,
    "topk": topk,
    "proposal": propose,
    "lookup": lookup,
    "residual": residual,
    "verify": verify,
}


def run_sharded(name: str, layout: ShardLayout, *args, **kwargs):
    """Run kernel ``name`` over ``layout``; returns (result, collective log)."""
    comm = Collectives(layout.n)
    return KERNELS[name](layout, comm, *args, **kwargs), comm.log
