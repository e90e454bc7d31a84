"""Full-target residual mass and sampling (kernel 5), in exact fixed point.

For a target row p and q counts c (q = c / 2^24, zero outside a sparse support), with
P = floor(p * 2^61) and S = sum(P) (fixed.py):

    Q_v = floor(c_v * S / 2^24)         q in the row's units (p / S is the normalised p)
    R_v = max(P_v - Q_v, 0)             for EVERY id, including ids outside the support
    W   = sum(R),  T = floor(u53 * W / 2^53)
    id  = the smallest j with R_0 + ... + R_j > T

All integer, so the id is the same for any block size, backend or vocabulary sharding.
It is the contract's inverse-CDF pick (docs/distribution.md) over R exactly; R differs
from the exact residual of p / S only by the floor in Q_v (< 1 unit of 2^-61 S per
support id) and by p entries below 2^-38 that are not multiples of 2^-61.

Torch path: block sums first, then one block's cumulative sum (no full-row scan). The
chosen lane always has R > 0, so padding lanes and ids >= vocab can never be returned.

Residual underflow: W == 0 while rejecting cannot happen for a rejection decided by
``fixed.accepts_exact`` (rejecting means P_x < c_x S / 2^24, which leaves W >= 1), but
the kernel is total: for a row with W == 0 it picks from P with the same draw and sets
the row's ``underflow`` flag (pp1q.core.verify's rule), which callers count.
"""

from __future__ import annotations

import torch

from pp1q.core.errors import DistributionError, LocalProtocolError, Reason

from .fixed import block_sums, check_target, check_totals, draw_threshold, q_units, to_fixed
from .lookup import SparseCounts
from .proposal import first_above

BLOCK = 256  # torch path block: ~500 block sums for 129280 ids, then one 256-lane scan


def pick_blocks(w: torch.Tensor, sums: torch.Tensor, thr: torch.Tensor, block: int = BLOCK):
    """Smallest j with w_0 + ... + w_j > thr per row, given block ``sums`` (thr < total)."""
    n, v = w.shape
    cum = sums.cumsum(-1)
    b = first_above(cum, thr)
    prefix = torch.where(b > 0, cum.gather(-1, (b - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1), 0)
    lanes = b.unsqueeze(-1) * block + torch.arange(block, device=w.device)
    inside = lanes < v
    lane_w = torch.where(inside, w.gather(-1, lanes.clamp(max=v - 1)), 0)
    off = first_above(lane_w.cumsum(-1) + prefix.unsqueeze(-1), thr)
    return b * block + off


def pick_fixed(w: torch.Tensor, thr: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Inverse-CDF pick over int64 weight rows [n, V] at integer thresholds thr < total."""
    return pick_blocks(w, block_sums(w, block), thr, block)


def target_fixed(p: torch.Tensor, validate: bool = True) -> torch.Tensor:
    """P = floor(p * 2^61) of target rows, checked first when ``validate``."""
    if validate:
        check_target(p)
    return to_fixed(p)


def sparse_cut(P: torch.Tensor, s_total: torch.Tensor, q: SparseCounts, use_q=None):
    """(clamped ids, delta = R - P <= 0) at each support entry of sparse q rows."""
    counts = q.counts if use_q is None else q.counts * use_q.unsqueeze(-1)
    ids = q.ids.clamp(max=P.shape[-1] - 1)  # padding lanes carry count 0: delta 0
    return ids, -torch.minimum(P.gather(-1, ids), q_units(counts, s_total.unsqueeze(-1)))


def apply_q(P: torch.Tensor, s_total: torch.Tensor, q, use_q=None) -> torch.Tensor:
    """R = max(P - Q, 0) (dense q: a new tensor; sparse q: P is updated in place)."""
    if q is None:
        return P
    if isinstance(q, SparseCounts):
        return P.scatter_add_(-1, *sparse_cut(P, s_total, q, use_q))
    counts = q.to(torch.int64)
    if use_q is not None:
        counts = counts * use_q.unsqueeze(-1)
    return (P - q_units(counts, s_total.unsqueeze(-1))).clamp_(min=0)


SPARSE_DENSITY = 16  # a dense q row with under 1/16 nonzero counts is corrected per entry


def _nonzero(q: torch.Tensor, use_q):
    mask = q != 0 if use_q is None else (q != 0) & use_q.unsqueeze(-1)
    return mask.nonzero(as_tuple=True)


def _mostly_zero(q: torch.Tensor) -> bool:
    return int(torch.count_nonzero(q)) * SPARSE_DENSITY < q.numel()


def residual_sample(p: torch.Tensor, q, u53: torch.Tensor, *, use_q=None, validate=True,
                    block: int = BLOCK):
    """Ids [n] and underflow flags [n] for rows p [n, V] (float), q dense/sparse/None.

    ``use_q`` [n] bool: rows where q applies (others sample p itself, e.g. the bonus).
    """
    P = target_fixed(p, validate)
    psums = block_sums(P, block)  # one reduction gives S and, for sparse q, R's block sums
    s_total = psums.sum(-1)
    if validate:
        check_totals(s_total)
    return sample_fixed(P, s_total, q, u53, use_q=use_q, psums=psums,
                        fresh=lambda rows: to_fixed(p[rows]), block=block)


def sample_fixed(P, s_total, q, u53, *, use_q=None, fresh, psums=None, block: int = BLOCK):
    """``residual_sample`` on fixed-point rows P [n, V] (consumed: sparse q edits it).

    ``fresh(rows)`` returns those rows of P again, for the underflow fallback;
    ``psums``: P's block sums if already known (saves a pass for sparse q or none).
    """
    if psums is not None and isinstance(q, SparseCounts):
        ids, delta = sparse_cut(P, s_total, q, use_q)
        R = P.scatter_add_(-1, ids, delta)
        sums = psums.scatter_add(-1, ids // block, delta)
    elif psums is not None and q is not None and _mostly_zero(q):
        R, sums = P, psums.clone()  # dense q with few nonzeros: correct only those
        rows, cols = _nonzero(q, use_q)
        delta = -torch.minimum(P[rows, cols], q_units(q[rows, cols].to(torch.int64),
                                                       s_total[rows]))
        R.index_put_((rows, cols), delta, accumulate=True)
        sums.index_put_((rows, cols // block), delta, accumulate=True)
    elif psums is not None and q is None:
        R, sums = P, psums.clone()
    else:
        R = apply_q(P, s_total, q, use_q)
        sums = block_sums(R, block)
    total = sums.sum(-1)
    under = total == 0
    u53 = u53.to(torch.int64)
    # picked before the underflow is known (a row with no residual mass picks past the
    # end, harmlessly): both flags then come back in one read, one sync on a GPU
    ids = pick_blocks(R, sums, draw_threshold(u53, total), block)
    any_under, past = torch.stack([under.any(), (ids >= P.shape[-1]).any()]).tolist()
    if any_under:  # pick from p itself with the same draw, flagged
        rows = under.nonzero().squeeze(-1)
        R[rows] = fresh(rows)
        sums[rows] = block_sums(R[rows], block)
        total = sums.sum(-1)
        if bool((total == 0).any()):
            raise DistributionError(Reason.ZERO_MASS, "target row has no mass at 2^-61")
        ids = pick_blocks(R, sums, draw_threshold(u53, total), block)
        past = bool((ids >= P.shape[-1]).any())
    if past:  # unreachable by construction; never hand it out
        raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, "pick fell past the last id")
    return ids, under


def target_sample(p: torch.Tensor, u53: torch.Tensor, validate=True) -> torch.Tensor:
    """Inverse-CDF pick over p itself (bonus and target-only steps)."""
    return residual_sample(p, None, u53, validate=validate)[0]
