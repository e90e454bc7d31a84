"""Exact integer arithmetic shared by every kernel (torch, any device).

Why integers: a float sum depends on its association order, and torch on CPU, torch on
CUDA, Triton tiles and vocabulary shards all associate differently. A float CDF therefore
gives implementation-dependent ids near boundaries. Integer sums are exact in any order,
so every backend and every sharding returns bit-identical ids and counts.

Fixed-point target rows: P_v = floor(p_v * 2^61) (int64). For float32 p every entry
>= 2^-38 is exact; smaller ones lose under 2^-61 each. S = sum(P) is the row's exact
normaliser (the rounds use p / S, as pp1q.core.verify and the oracle normalise p).

Wide products: values below 2^62 are split into 31-bit halves, so a full 124-bit product
is held as (hi, lo) with lo < 2^62 and no intermediate ever exceeds 2^63 in int64.
"""

from __future__ import annotations

import torch

from pp1q.core.errors import DistributionError, LocalProtocolError, Reason
from pp1q.core.q import MASS

FIXED_BITS = 61  # p <= 1 keeps every P_v <= 2^61; a row total <= 2 keeps S < 2^62
FIXED_ONE = float(1 << FIXED_BITS)
MASS_BITS = 24  # q = c / 2^24 (dyadic24-standard-v1)
U53_BITS = 53  # acceptance / correction / bonus draws are 53-bit integers
WIDE_LIMB = 62  # radix of (hi, lo) products: lo < 2^62
S_LIMIT = 1 << 62  # exclusive bound on S so that every wide product operand is < 2^62
HALF = (1 << 31) - 1  # 31-bit halves: half * half < 2^62, a sum of two < 2^63
LO_MASK = (1 << WIDE_LIMB) - 1

SUM_LIMB_BITS = 45  # exact float sums: limbs of 45 bits, 2^17 entries sum below 2^62
SUM_MAX_ENTRIES = 1 << 17  # the DeepSeek vocabulary (129280) fits; larger rows are refused
_SUM_SCALE = float(1 << SUM_LIMB_BITS)
_SUM_MASK = (1 << SUM_LIMB_BITS) - 1
_SUM_BLOCK = 256  # 256 limbs of <= 2^45 sum below 2^53: exact in float64

assert MASS == 1 << MASS_BITS


# ---------------------------------------------------------------------------
# wide products


def mul_wide(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a * b = hi * 2^62 + lo exactly, for int64 0 <= a, b < 2^62 (broadcast)."""
    a1, a0 = a >> 31, a & HALF
    b1, b0 = b >> 31, b & HALF
    mid = a1 * b0 + a0 * b1  # < 2^63
    lo = a0 * b0 + ((mid & HALF) << 31)  # < 2^63
    hi = a1 * b1 + (mid >> 31) + (lo >> WIDE_LIMB)
    return hi, lo & LO_MASK


def shift_wide(hi: torch.Tensor, lo: torch.Tensor, s: int) -> torch.Tensor:
    """floor((hi * 2^62 + lo) / 2^s) for 0 < s <= 62; the result must fit in int64."""
    return (hi << (WIDE_LIMB - s)) | (lo >> s)


def floor_mul_shift(a: torch.Tensor, b: torch.Tensor, s: int) -> torch.Tensor:
    """floor(a * b / 2^s) exactly (0 <= a, b < 2^62, result < 2^63)."""
    return shift_wide(*mul_wide(a, b), s)


def draw_threshold(u53: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """T = floor(u53 * W / 2^53): for integer C, C > (u53 / 2^53) * W iff C > T.

    u53 < 2^53 makes T < W, so the last positive weight always satisfies C > T.
    """
    return floor_mul_shift(u53, total, U53_BITS)


def q_units(counts: torch.Tensor, s_total: torch.Tensor) -> torch.Tensor:
    """floor(c * S / 2^24): q in the fixed-point units of a target row with total S.

    With S = Sh * 2^24 + Sl: c * Sh < 2^62 and c * Sl < 2^48 for c <= 2^24, so two
    int64 products give the exact floor (cheaper than a wide product on full rows).
    """
    return counts * (s_total >> MASS_BITS) + ((counts * (s_total & (MASS - 1))) >> MASS_BITS)


def accepts_exact(u53, counts, p_x, s_total) -> torch.Tensor:
    """u53 / 2^53 < (P_x / S) / (c / 2^24), decided exactly (strict; c >= 1).

    Equivalent to c * (T1 + r1 / 2^53) < P_x * 2^24 with u * S = T1 * 2^53 + r1; the
    right side is an integer, so the fractional part of c * r1 / 2^53 never decides.
    """
    hi_us, lo_us = mul_wide(u53, s_total)
    t1 = shift_wide(hi_us, lo_us, U53_BITS)  # < S < 2^62
    r1 = lo_us & ((1 << U53_BITS) - 1)
    e_hi, e_lo = mul_wide(counts, t1)
    e_lo = e_lo + floor_mul_shift(counts, r1, U53_BITS)  # + (< 2^24)
    e_hi = e_hi + (e_lo >> WIDE_LIMB)
    e_lo = e_lo & LO_MASK
    shift = WIDE_LIMB - MASS_BITS  # P_x * 2^24 = (P_x >> 38) * 2^62 + (low 38 bits) << 24
    r_hi = p_x >> shift
    r_lo = (p_x & ((1 << shift) - 1)) << MASS_BITS
    return (e_hi < r_hi) | ((e_hi == r_hi) & (e_lo < r_lo))


# ---------------------------------------------------------------------------
# fixed-point target rows


def to_fixed(p: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """P = floor(p * 2^61) as int64 (p float32/float64 in [0, 1]; the scaling is exact).

    ``out``: an int64 tensor of p's shape to write P into (a caller's reused buffer: a
    fresh 25 MB tensor per round costs its page faults every time). The scaled floats go
    through ``out``'s own bytes viewed as float64, element k over element k.
    """
    if p.dtype in (torch.float16, torch.bfloat16):
        p = p.float()  # 2^61 overflows the half formats; the widening is exact
    if out is None:
        return (p * FIXED_ONE).to(torch.int64)
    scaled = out.view(torch.float64)
    torch.mul(p, FIXED_ONE, out=scaled)
    return out.copy_(scaled)


def target_ok(p: torch.Tensor) -> torch.Tensor:
    """A bool tensor on p's device, true when ``check_target`` would pass floating rows p:
    one min/max pass (NaN fails both comparisons, +-inf one) and the float64 row sums,
    read by nobody here, so a caller on a GPU can read several rows' flags in one sync."""
    lo, hi = torch.aminmax(p)
    return (lo >= 0) & (hi <= 1) & (p.sum(-1, dtype=torch.float64) < 2).all()


def check_target(p: torch.Tensor) -> None:
    """Refuse a target row that is not a probability row (before any fixed-point use).

    One min/max pass covers NaN, +-inf, negatives and entries above 1; a float64 row
    sum below 2 then rules out int64 overflow of S (which would need a sum >= 4). The
    passing case reads one flag (``target_ok``: one host sync on a GPU); a failing row
    is then looked at again for the first failing check, in the order below.
    """
    if not p.is_floating_point():
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"target rows are {p.dtype}")
    if not p.numel() or bool(target_ok(p)):
        return
    lo, hi = torch.aminmax(p)
    if not (bool(lo >= 0) and bool(hi <= 1)):  # NaN fails both comparisons
        if not bool(torch.isfinite(p).all()):
            raise DistributionError(Reason.NON_FINITE, "target row is not finite")
        if bool(lo < 0):
            raise DistributionError(Reason.NEGATIVE_VALUE, "negative target probability")
        raise DistributionError(Reason.WRONG_MASS, "target probability above 1")
    raise DistributionError(Reason.WRONG_MASS, "target row sums to 2 or more")


def check_rows(rows) -> None:
    """``check_target`` on each of ``rows`` (floating tensors on one device), in order:
    their flags read in one sync; a failing batch is checked row by row, so the refusal
    is the first failing row's, as checking them one at a time gives."""
    if not rows:
        return
    if all(r.is_floating_point() and r.numel() for r in rows) \
            and bool(torch.stack([target_ok(r) for r in rows]).all()):
        return
    for r in rows:
        check_target(r)


def totals_ok(s_total: torch.Tensor) -> torch.Tensor:
    """A bool tensor, true when ``check_totals`` would pass (one flag to read)."""
    return ((s_total > 0) & (s_total < S_LIMIT)).all()


def check_totals(s_total: torch.Tensor) -> None:
    """S must be positive (some mass at 2^-61 resolution) and below 2^62 (row sum < 2);
    the passing case reads one flag."""
    if not s_total.numel() or bool(totals_ok(s_total)):
        return
    if not bool((s_total > 0).all()):
        raise DistributionError(Reason.ZERO_MASS, "target row has no mass at 2^-61")
    raise DistributionError(Reason.WRONG_MASS, "target row sums to 2 or more")


# ---------------------------------------------------------------------------
# order-independent float64 sums


def block_sums(w: torch.Tensor, block: int) -> torch.Tensor:
    """Sums of consecutive ``block`` entries along the last dim of rows [n, V]."""
    n, v = w.shape
    full = v // block
    w = w.contiguous()
    parts = [w.as_strided((n, full, block), (v, block, 1)).sum(-1)] if full else []
    if v % block:
        parts.append(w[:, full * block :].sum(-1, keepdim=True))
    return torch.cat(parts, -1)


def exact_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of float64 values in [0, 1] along the last dim of rows, independent of order.

    Each value is cut into two 45-bit fixed-point limbs (resolution 2^-90; the part
    below is dropped, under n * 2^-90 in all); limb sums are exact integer sums, so any
    split into shards or tiles gives the same limbs, and one fixed conversion rounds
    them to float64 (within half an ulp plus 2^-80 relative).
    """
    return limbs_to_float(*sum_limbs(x))


def _int_sum(f: torch.Tensor) -> torch.Tensor:
    """Exact int64 row sums of integer-valued float64 entries below 2^45: blocks of 256
    sum exactly in float64 (< 2^53), so only the block sums are converted."""
    return block_sums(f, _SUM_BLOCK).to(torch.int64).sum(-1)


def sum_limbs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two int64 limb sums of ``exact_sum`` over rows [n, V] (add them across shards)."""
    if x.shape[-1] > SUM_MAX_ENTRIES:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"{x.shape[-1]} > {SUM_MAX_ENTRIES}")
    lead = x.shape[:-1]
    a = (x * _SUM_SCALE).reshape(-1, x.shape[-1])
    hi = torch.floor(a)
    lo = torch.floor(a.sub_(hi).mul_(_SUM_SCALE))  # exact: the fraction of a float, rescaled
    return _int_sum(hi).reshape(lead), _int_sum(lo).reshape(lead)


def limbs_to_float(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """(hi + lo * 2^-45) * 2^-45 as float64, by one fixed sequence of roundings."""
    hi = hi + (lo >> SUM_LIMB_BITS)
    lo = lo & _SUM_MASK
    head = hi.to(torch.float64)
    err = hi - head.to(torch.int64)  # exact: |err| <= 2^9 when hi < 2^62
    tail = err.to(torch.float64) + lo.to(torch.float64) / _SUM_SCALE
    return (head + tail) / _SUM_SCALE
