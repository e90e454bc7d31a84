"""Triton count allocation: counts.allocate on a GPU, same integers.

One program per row. Pass 1 sums floor(w * 2^24) and counts the eligible (w > 0)
entries; the threshold remainder is found by bisection over the IEEE bit patterns of
the fractional remainders (for non-negative doubles the bit order is the value order, so
62 steps find the remaining-th largest exactly); a counting pass gives the entries above
it; the last pass writes floor + 1 for those and for the lowest-id ties until
``remaining`` tickets are handed out. Only comparisons and integer sums: the counts
equal counts.allocate bit for bit. (A radix select would need fewer passes; bisection
was chosen for being obviously exact. GPU speed is not measured here: no GPU.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pp1q.core.errors import DistributionError, Reason
from pp1q.core.q import MASS

BLOCK = 1024  # lanes per tile on a GPU (tests pass a small block to cross tile edges)
_MASS = tl.constexpr(float(MASS))
_MASS_INT = tl.constexpr(MASS)
_KEY_TOP = tl.constexpr(1 << 62)  # above the bits of every remainder (< 1.0 = 0x3FF0...)
_STEPS = tl.constexpr(62)


@triton.jit
def _tile(base, t, V, BLOCK: tl.constexpr):
    """(floor counts, remainder keys, lane mask) of one tile; key -1 where w == 0."""
    lanes = t * BLOCK + tl.arange(0, BLOCK)
    m = lanes < V
    w = tl.load(base + lanes, mask=m, other=0.0)
    scaled = w * _MASS
    fl = tl.floor(scaled)
    key = tl.where(w > 0, (scaled - fl).to(tl.int64, bitcast=True), -1)
    return fl.to(tl.int64), key, lanes, m


@triton.jit
def _allocate(w_ptr, out_ptr, status_ptr, V, NT: tl.constexpr, BLOCK: tl.constexpr):
    # NT (tiles a row) bounds Python loops, so it is a compile-time constant: Triton 3.6's
    # interpreter cannot take a runtime loop bound under NumPy >= 2.4; one variant a
    # vocabulary
    r = tl.program_id(0).to(tl.int64)
    base = w_ptr + r * V
    floor_sum = r * 0
    eligible = r * 0
    for t in range(NT):
        fl, key, lanes, m = _tile(base, t, V, BLOCK)
        floor_sum += tl.sum(fl, axis=0)
        eligible += tl.sum((key >= 0).to(tl.int64), axis=0)
    remaining = _MASS_INT - floor_sum
    ok = (remaining >= 0) & (remaining < _MASS_INT) & (remaining <= eligible)
    lo = r * 0
    hi = lo + _KEY_TOP
    for _ in range(_STEPS):
        mid = (lo + hi) >> 1
        cnt = r * 0
        for t in range(NT):
            fl, key, lanes, m = _tile(base, t, V, BLOCK)
            cnt += tl.sum((key >= mid).to(tl.int64), axis=0)
        take = cnt >= remaining
        lo = tl.where(take, mid, lo)
        hi = tl.where(take, hi, mid)
    kth = tl.where(remaining > 0, lo, _KEY_TOP)
    above = r * 0
    for t in range(NT):
        fl, key, lanes, m = _tile(base, t, V, BLOCK)
        above += tl.sum((key > kth).to(tl.int64), axis=0)
    need = remaining - above
    seen = r * 0
    for t in range(NT):
        fl, key, lanes, m = _tile(base, t, V, BLOCK)
        tied = (key == kth).to(tl.int64)
        rank = tl.cumsum(tied, axis=0) + seen
        ticket = (key > kth) | ((tied > 0) & (rank <= need))
        seen += tl.sum(tied, axis=0)
        tl.store(out_ptr + r * V + lanes, tl.where(ok, fl + ticket.to(tl.int64), 0), mask=m)
    tl.store(status_ptr + r, ok.to(tl.int32))


def allocate(w: torch.Tensor, *, block: int = BLOCK) -> torch.Tensor:
    """Same contract and results as counts.allocate (normalised FP64 weight rows)."""
    lead, v = w.shape[:-1], w.shape[-1]
    w2 = w.to(torch.float64).reshape(-1, v).contiguous()
    n = w2.shape[0]
    out = torch.zeros((n, v), dtype=torch.int64, device=w.device)
    status = torch.empty(n, dtype=torch.int32, device=w.device)
    _allocate[(n,)](w2, out, status, v, triton.cdiv(v, block), BLOCK=block)
    if not bool((status == 1).all()):
        raise DistributionError(Reason.ALLOCATION_INCONSISTENT, "remaining tickets out of range")
    if not bool((out.sum(-1) == MASS).all()):
        raise DistributionError(Reason.ALLOCATION_INCONSISTENT, "counts do not sum to MASS")
    return out.reshape(*lead, v)
