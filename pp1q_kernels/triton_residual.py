"""Triton residual mass and sampling: the GPU form of residual.py, same integers.

Two launches (three with dense q):
1. ``_tile_sums`` on a (rows, tiles) grid: per-tile sums of P = floor(p * 2^61)
   (dense q: a second launch sums R = max(P - Q, 0), which needs the row total S).
2. ``_pick`` per row: sparse q corrections from the K support entries, the row's W,
   T = floor(u * W / 2^53), the tile holding T by an integer prefix over tile sums,
   then an integer cumulative sum inside that one tile.
Lanes past the vocabulary load weight 0, so they can never be the first lane whose
cumulative sum exceeds T (the CVE-2026-54234 class): the winner always has R > 0.
Rows are addressed through index arrays, so the verification step samples the chosen
rows of a [B * (D + 1), V] tensor without gathering them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pp1q.core.errors import DistributionError, LocalProtocolError, Reason

from .fixed import check_target, check_totals
from .lookup import SparseCounts
from .triton_common import floor_mul_shift, q_units, to_fixed

BLOCK = 1024  # lanes per tile on a GPU (tests pass a small block to cross tile edges)
FLAG_UNDERFLOW = 1  # residual had no mass: picked from p with the same draw
FLAG_NO_MASS = 2  # p itself had no mass at 2^-61: no id is written (-1), the host raises
Q_NONE, Q_DENSE, Q_SPARSE = 0, 1, 2


@triton.jit
def _tile_sums(p_ptr, p_row_ptr, q_ptr, q_row_ptr, s_ptr, out_ptr, V, NT,
               DENSE_Q: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    t = tl.program_id(1)
    lanes = t * BLOCK + tl.arange(0, BLOCK)
    m = lanes < V
    prow = tl.load(p_row_ptr + r).to(tl.int64)
    w = to_fixed(tl.load(p_ptr + prow * V + lanes, mask=m, other=0.0))
    if DENSE_Q:
        qrow = tl.load(q_row_ptr + r).to(tl.int64)
        use = (qrow >= 0).to(tl.int64)
        c = tl.load(q_ptr + tl.maximum(qrow, 0) * V + lanes, mask=m, other=0).to(tl.int64)
        w = tl.maximum(w - q_units(c * use, tl.load(s_ptr + r)), 0)
    tl.store(out_ptr + r * NT + t, tl.sum(w, axis=0))


@triton.jit
def _pick(p_ptr, p_row_ptr, q_ptr, qid_ptr, q_row_ptr, psum_ptr, rsum_ptr, u_ptr,
          tok_ptr, flag_ptr, V, NT, K,
          Q_MODE: tl.constexpr, BLOCK: tl.constexpr, NT_P2: tl.constexpr, K_P2: tl.constexpr):
    r = tl.program_id(0)
    prow = tl.load(p_row_ptr + r).to(tl.int64)
    qrow = tl.load(q_row_ptr + r).to(tl.int64)
    use = (qrow >= 0).to(tl.int64)
    qrow = tl.maximum(qrow, 0)
    tiles = tl.arange(0, NT_P2)
    psums = tl.load(psum_ptr + r * NT + tiles, mask=tiles < NT, other=0)
    s_total = tl.sum(psums, axis=0)
    rsums = psums
    if Q_MODE == 1:
        rsums = tl.load(rsum_ptr + r * NT + tiles, mask=tiles < NT, other=0)
    if Q_MODE == 2:
        k = tl.arange(0, K_P2)
        ids = tl.load(qid_ptr + qrow * K + k, mask=k < K, other=V).to(tl.int64)
        cnt = tl.load(q_ptr + qrow * K + k, mask=k < K, other=0).to(tl.int64) * use
        p_k = to_fixed(tl.load(p_ptr + prow * V + ids, mask=ids < V, other=0.0))
        cut = tl.minimum(p_k, q_units(cnt, s_total))  # P - R at each support id; 0 on padding
        hit = (ids // BLOCK)[None, :] == tiles[:, None]
        rsums = psums - tl.sum(tl.where(hit, cut[None, :], 0), axis=1)
    total = tl.sum(rsums, axis=0)
    under = total == 0
    rsums = tl.where(under, psums, rsums)
    total = tl.where(under, s_total, total)
    use = use * (1 - under.to(tl.int64))
    thr = floor_mul_shift(tl.load(u_ptr + r).to(tl.int64), total, 53)
    cum_tiles = tl.cumsum(rsums, axis=0)
    tile = tl.sum((cum_tiles <= thr).to(tl.int64), axis=0)
    carry = tl.sum(tl.where(tiles < tile, rsums, 0), axis=0)
    lanes = tile * BLOCK + tl.arange(0, BLOCK)
    lm = lanes < V
    w = to_fixed(tl.load(p_ptr + prow * V + lanes, mask=lm, other=0.0))
    if Q_MODE == 1:
        c = tl.load(q_ptr + qrow * V + lanes, mask=lm, other=0).to(tl.int64)
        w = tl.maximum(w - q_units(c * use, s_total), 0)
    if Q_MODE == 2:
        at = ids[None, :] == lanes[:, None]
        w = w - tl.sum(tl.where(at, cut[None, :], 0), axis=1) * use
    cum = tl.cumsum(w, axis=0) + carry
    tok = tile * BLOCK + tl.sum((cum <= thr).to(tl.int64), axis=0)
    empty = total == 0
    tl.store(tok_ptr + r, tl.where(empty, -1, tok))
    tl.store(flag_ptr + r, tl.where(empty, 2, under.to(tl.int32)))


def widen_half(p: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 rows as float32 (exact): 2^61 overflows the half formats."""
    return p.float() if p.dtype in (torch.float16, torch.bfloat16) else p


def _p2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def sample_rows(p2d, p_rows, q, q_rows, u53, *, psums=None, block=BLOCK):
    """Ids and flags for rows p2d[p_rows] against q rows q[q_rows] (-1: no q).

    p2d [N, V] float; q None, dense counts [Nq, V] or SparseCounts [Nq, K]; u53 [n].
    ``psums``: per-tile P sums of the addressed rows [n, NT] if already computed.
    """
    n, V = p_rows.shape[0], p2d.shape[-1]
    nt = triton.cdiv(V, block)
    p2d = p2d.contiguous()
    dummy = torch.zeros(1, dtype=torch.int64, device=p2d.device)
    if psums is None:
        psums = tile_sums(p2d, p_rows, block=block)
    mode, rsums, qc, qid, k = Q_NONE, psums, dummy, dummy, 1
    if isinstance(q, SparseCounts):
        mode, qc, qid, k = Q_SPARSE, q.counts.contiguous(), q.ids.contiguous(), q.width
    elif q is not None:
        mode, qc = Q_DENSE, q.contiguous()
        rsums = torch.empty((n, nt), dtype=torch.int64, device=p2d.device)
        _tile_sums[(n, nt)](p2d, p_rows, qc, q_rows, psums.sum(-1), rsums, V, nt,
                            DENSE_Q=True, BLOCK=block)
    tok = torch.empty(n, dtype=torch.int64, device=p2d.device)
    flag = torch.empty(n, dtype=torch.int32, device=p2d.device)
    _pick[(n,)](p2d, p_rows, qc, qid, q_rows, psums, rsums, u53.to(torch.int64).contiguous(),
                tok, flag, V, nt, k, Q_MODE=mode, BLOCK=block, NT_P2=_p2(nt), K_P2=_p2(k))
    if bool((flag == FLAG_NO_MASS).any()):
        raise DistributionError(Reason.ZERO_MASS, "target row has no mass at 2^-61")
    if bool(((tok < 0) | (tok >= V)).any()):  # unreachable by construction
        raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, "pick fell outside the vocabulary")
    return tok, flag == FLAG_UNDERFLOW


def tile_sums(p2d, p_rows, *, block=BLOCK):
    """Per-tile P sums [n, NT] of rows p2d[p_rows] (their sum is the row total S)."""
    n, V = p_rows.shape[0], p2d.shape[-1]
    nt = triton.cdiv(V, block)
    out = torch.empty((n, nt), dtype=torch.int64, device=p2d.device)
    dummy = torch.zeros(1, dtype=torch.int64, device=p2d.device)
    _tile_sums[(n, nt)](p2d.contiguous(), p_rows, dummy, dummy, dummy, out, V, nt,
                        DENSE_Q=False, BLOCK=block)
    return out


def residual_sample(p, q, u53, *, use_q=None, validate=True, block=BLOCK):
    """Same contract and results as residual.residual_sample, on Triton."""
    p = widen_half(p)
    n = p.shape[0]
    if validate:
        check_target(p)
    rows = torch.arange(n, device=p.device)
    psums = tile_sums(p, rows, block=block)
    if validate:
        check_totals(psums.sum(-1))
    q_rows = rows if use_q is None else torch.where(use_q, rows, -1)
    return sample_rows(p, rows, q, q_rows if q is not None else rows * 0 - 1, u53,
                       psums=psums, block=block)
