"""Triton device functions shared by the Triton kernels.

Each mirrors a torch function of fixed.py / philox.py operation for operation on int64,
so Triton and torch agree bit for bit (tests run both, the Triton side under
TRITON_INTERPRET=1 on CPU). Import only where Triton is wanted: importing this module
imports triton.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .fixed import FIXED_ONE, HALF, LO_MASK, MASS_BITS, U53_BITS, WIDE_LIMB

_HALF = tl.constexpr(HALF)
_LO_MASK = tl.constexpr(LO_MASK)
_LIMB = tl.constexpr(WIDE_LIMB)
_MASS_BITS = tl.constexpr(MASS_BITS)
_U53 = tl.constexpr(U53_BITS)
_FIXED_ONE = tl.constexpr(FIXED_ONE)
_MASS_MASK = tl.constexpr((1 << MASS_BITS) - 1)
_U53_MASK = tl.constexpr((1 << U53_BITS) - 1)
_P_SPLIT = tl.constexpr(WIDE_LIMB - MASS_BITS)  # P_x * 2^24 = (P_x >> 38, low 38 bits << 24)
_P_SPLIT_MASK = tl.constexpr((1 << (WIDE_LIMB - MASS_BITS)) - 1)


@triton.jit
def mul_wide(a, b):
    """a * b = hi * 2^62 + lo (int64, 0 <= a, b < 2^62), as fixed.mul_wide."""
    a1 = a >> 31
    a0 = a & _HALF
    b1 = b >> 31
    b0 = b & _HALF
    mid = a1 * b0 + a0 * b1
    lo = a0 * b0 + ((mid & _HALF) << 31)
    hi = a1 * b1 + (mid >> 31) + (lo >> _LIMB)
    return hi, lo & _LO_MASK


@triton.jit
def floor_mul_shift(a, b, s: tl.constexpr):
    hi, lo = mul_wide(a, b)
    return (hi << (_LIMB - s)) | (lo >> s)


@triton.jit
def q_units(c, s_total):
    """floor(c * S / 2^24), as fixed.q_units."""
    return c * (s_total >> _MASS_BITS) + ((c * (s_total & _MASS_MASK)) >> _MASS_BITS)


@triton.jit
def accepts_exact(u, c, p_x, s_total):
    """u / 2^53 < (P_x / S) / (c / 2^24), as fixed.accepts_exact."""
    hi_us, lo_us = mul_wide(u, s_total)
    t1 = (hi_us << (_LIMB - _U53)) | (lo_us >> _U53)
    r1 = lo_us & _U53_MASK
    e_hi, e_lo = mul_wide(c, t1)
    e_lo = e_lo + floor_mul_shift(c, r1, _U53)
    e_hi = e_hi + (e_lo >> _LIMB)
    e_lo = e_lo & _LO_MASK
    r_hi = p_x >> _P_SPLIT
    r_lo = (p_x & _P_SPLIT_MASK) << _MASS_BITS
    return (e_hi < r_hi) | ((e_hi == r_hi) & (e_lo < r_lo))


@triton.jit
def to_fixed(p):
    """floor(p * 2^61) as int64 (p >= 0; the scaling is exact in float32 and float64)."""
    return (p * _FIXED_ONE).to(tl.int64)


@triton.jit
def keyed_u53(seed, generation, round_id, position, domain: tl.constexpr):
    """53-bit draw keyed as pp1q.core.rng: counter (0, pos, round, dom << 24 | gen), key seed."""
    zero = (position * 0).to(tl.uint32)
    w0, w1, w2, w3 = tl.philox(
        seed,
        zero,
        position.to(tl.uint32),
        round_id.to(tl.uint32),
        (generation | (domain << 24)).to(tl.uint32),
    )
    return (w0.to(tl.int64) << 21) | (w1.to(tl.int64) >> 11)


@triton.jit
def _philox_words_kernel(ctr_ptr, seed_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    # four loads written out: Triton's compiler takes no list comprehension (only the
    # interpreter, plain Python, does; tests/kernels/test_kernels_compile.py)
    c0 = tl.load(ctr_ptr + i * 4, mask=m, other=0).to(tl.uint32)
    c1 = tl.load(ctr_ptr + i * 4 + 1, mask=m, other=0).to(tl.uint32)
    c2 = tl.load(ctr_ptr + i * 4 + 2, mask=m, other=0).to(tl.uint32)
    c3 = tl.load(ctr_ptr + i * 4 + 3, mask=m, other=0).to(tl.uint32)
    seed = tl.load(seed_ptr + i, mask=m, other=0)
    w = tl.philox(seed, c0, c1, c2, c3)
    for j in tl.static_range(4):
        tl.store(out_ptr + i * 4 + j, w[j].to(tl.int64), mask=m)


def philox_words(counter, seeds):
    """tl.philox words (n, 4) int64 for counters (n, 4) and 64-bit seeds (n,) (int64)."""
    import torch

    n = counter.shape[0]
    out = torch.empty((n, 4), dtype=torch.int64, device=counter.device)
    _philox_words_kernel[(triton.cdiv(n, 64),)](counter.contiguous(), seeds.contiguous(), out, n,
                                                BLOCK=64)
    return out
