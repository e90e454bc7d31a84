"""A round's keyed draws in numba: pp1q.core.verify.round_draws in one call.

The words of pp1q.core.rng's Philox4x32-10 (key = seed's low and high words; counter =
(0, position, round, domain << 24 | generation)), 53-bit draws as
pp1q.core.rng.u53_from_words forms them. Words are held in int64 and 32x32-bit
products formed from 16-bit halves, as pp1q_kernels.philox does, so nothing leaves
int64. The numpy path costs ~0.2 ms a round in small-array calls (4 requests x 11
draws); this is a few microseconds. tests/kernels/test_kernels_numba.py holds it to
round_draws over random and extreme keys.

Imported only by pp1q_kernels.numba_rows, when numba decides (the key fields are
checked there first, as pp1q.core.rng checks them).
"""

from __future__ import annotations

import numpy as np

from .numba_step import jit as _jit

# Philox's constants and the counter layout as pp1q_kernels.philox states them (numba
# reads imported module globals as compile-time constants)
from .philox import _LO16, _LO32, _M0, _M1, _W0, _W1, DOMAIN_SHIFT, ROUNDS

ACCEPTANCE, CORRECTION, BONUS = 2, 3, 4  # pp1q.core.rng.Domain (checked by numba_rows)


@_jit
def _mulhilo(m, x):
    """(high, low) 32-bit words of m * x for a 32-bit constant m and a word x."""
    t_lo = m * (x & _LO16)
    t_hi = m * (x >> 16)
    lo = (t_lo + ((t_hi & _LO16) << 16)) & _LO32
    hi = (t_hi + (t_lo >> 16)) >> 16
    return hi, lo


@_jit
def u53(c1, c2, c3, k0, k1):
    """The 53-bit draw of counter (0, c1, c2, c3) under key (k0, k1)."""
    c0 = np.int64(0)
    for r in range(ROUNDS):  # the round body is philox4x32_10's, on scalars
        if r:
            k0 = (k0 + _W0) & _LO32
            k1 = (k1 + _W1) & _LO32
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return (c0 << 21) | (c1 >> 11)


@_jit
def round_draws(key_lo, key_hi, generation, round_id, first, u_acc, u_corr, u_bonus):
    """Fill u_acc, u_corr [B, D] and u_bonus [B] (int64) for B requests' keys (int64
    fields in range: the caller's checks)."""
    depth = u_acc.shape[1]
    for b in range(key_lo.size):
        k0, k1, rnd = key_lo[b], key_hi[b], round_id[b]
        for i in range(depth):
            pos = first[b] + i
            u_acc[b, i] = u53(pos, rnd, (ACCEPTANCE << DOMAIN_SHIFT) | generation[b], k0, k1)
            u_corr[b, i] = u53(pos, rnd, (CORRECTION << DOMAIN_SHIFT) | generation[b], k0, k1)
        u_bonus[b] = u53(first[b] + depth, rnd, (BONUS << DOMAIN_SHIFT) | generation[b], k0, k1)
