"""The verification step of one request in numba (CPU): one pass per target row it reaches.

The same integers as ``lazy_step`` / ``verify_step`` (fixed.py, residual.py), operation
for operation: P_v = floor(p_v * 2^61), S = sum(P), the ratio test ``accepts`` (fixed.
accepts_exact), the residual R = max(P - floor(c S / 2^24), 0) and the inverse-CDF pick
by blocks of ``BLOCK``. Nothing is stored per entry: one pass over a reached row checks
it (check_target's refusals), and sums its fixed-point values per block; the ratio test
reads P at the drafted id only; the residual pick reads the support's entries and one
block of the chosen row. The torch step instead writes P and reads it three more times.

Imported through pp1q_kernels.numba_rows (the backend choice) and, for ``jit``, by
numba_draws and numba_counts; with pp1q.core.q_scan the only modules that import numba.
No relative imports: a test loads a copy of this file with one planted change
(tests/kernels/test_kernels_numba.py) through the same seam.
"""

from __future__ import annotations

import numba
import numpy as np

# a row's verdicts; pp1q_kernels.numba_rows maps each to its closed-set Reason
OK, NON_FINITE, NEGATIVE, ABOVE_ONE, SUM_TWO, ZERO_MASS = range(6)

BLOCK = 256  # residual.BLOCK: the pick's block (ids are the same for any block size)
FIXED_ONE = 2.0**61  # fixed.FIXED_ONE: P_v = floor(p_v * 2^61)
WIDE_LIMB = 62  # fixed.WIDE_LIMB: (hi, lo) products with lo < 2^62
HALF = (1 << 31) - 1  # fixed.HALF: 31-bit halves keep every product below 2^62
LO_MASK = (1 << WIDE_LIMB) - 1
U53_BITS = 53
MASS_BITS = 24
_MASS = float(1 << MASS_BITS)  # a dense FP32 q times this: its integer count, exactly
S_LIMIT = 1 << 62  # fixed.S_LIMIT: S below 2^62 keeps every wide operand below 2^62
_LO32 = (1 << 32) - 1  # P splits into 32-bit halves so a row's sums cannot overflow
_HI_LIMIT = 1 << 30  # high half sum >= 2^30 means S >= 2^62


def jit(fn):
    """numba's njit as every pp1q_kernels kernel uses it (numba_draws too): cache=True as
    in pp1q.core.q_scan (a copy loaded from a string compiles afresh), no bound checks."""
    try:
        return numba.njit(cache=True, nogil=True, boundscheck=False)(fn)
    except RuntimeError:
        return numba.njit(nogil=True, boundscheck=False)(fn)


@jit
def mul_wide(a, b):
    """a * b = hi * 2^62 + lo exactly (0 <= a, b < 2^62): fixed.mul_wide."""
    a1, a0 = a >> 31, a & HALF
    b1, b0 = b >> 31, b & HALF
    mid = a1 * b0 + a0 * b1
    lo = a0 * b0 + ((mid & HALF) << 31)
    hi = a1 * b1 + (mid >> 31) + (lo >> WIDE_LIMB)
    return hi, lo & LO_MASK


@jit
def shift_wide(hi, lo, s):
    return (hi << (WIDE_LIMB - s)) | (lo >> s)


@jit
def accepts(u53, c, p_x, s_total):
    """u53 / 2^53 < (P_x / S) / (c / 2^24), exactly: fixed.accepts_exact."""
    hi_us, lo_us = mul_wide(u53, s_total)
    t1 = shift_wide(hi_us, lo_us, U53_BITS)
    r1 = lo_us & ((1 << U53_BITS) - 1)
    e_hi, e_lo = mul_wide(c, t1)
    r_hi_, r_lo_ = mul_wide(c, r1)
    e_lo = e_lo + shift_wide(r_hi_, r_lo_, U53_BITS)
    e_hi = e_hi + (e_lo >> WIDE_LIMB)
    e_lo = e_lo & LO_MASK
    shift = WIDE_LIMB - MASS_BITS
    r_hi = p_x >> shift
    r_lo = (p_x & ((1 << shift) - 1)) << MASS_BITS
    return (e_hi < r_hi) or ((e_hi == r_hi) and (e_lo < r_lo))


@jit
def q_units(c, s_total):
    """floor(c * S / 2^24): fixed.q_units."""
    return c * (s_total >> MASS_BITS) + ((c * (s_total & ((1 << MASS_BITS) - 1))) >> MASS_BITS)


@jit
def fixed(x):
    return np.int64(np.float64(x) * FIXED_ONE)  # exact scaling; truncation is the floor


@jit
def _block(p):
    """(entries outside [0, 1], high and low 32-bit halves' sums of P) over the slice p.
    Outside values (NaN too) count as 0: no branch on the data. Indices from 0 (never
    negative) and no early exit let LLVM vectorise the loop: 3-4x faster than a loop
    over an offset range."""
    bad = 0
    hi = np.int64(0)
    lo = np.int64(0)
    for j in range(p.size):
        x = np.float64(p[j])
        ok = (x >= 0.0) & (x <= 1.0)
        bad += not ok
        f = np.int64((x if ok else 0.0) * FIXED_ONE)
        hi += f >> 32
        lo += f & _LO32
    return bad, hi, lo


@jit
def scan_row(p, psums):
    """(verdict, S): check a row as fixed.check_target and check_totals do, and write the
    block sums of P into ``psums`` (ceil(V / BLOCK) entries), in one pass."""
    v = p.size
    bad = 0
    hi = np.int64(0)
    lo = np.int64(0)
    for k in range(psums.size):
        nb, bhi, blo = _block(p[k * BLOCK : min(v, (k + 1) * BLOCK)])
        psums[k] = (bhi << 32) + blo  # wraps only in a row refused below (S >= 2^62)
        bad += nb
        hi += bhi
        lo += blo
    if bad:  # cold: the first failing check in check_target's order
        for j in range(v):
            if not np.isfinite(p[j]):
                return NON_FINITE, 0
        for j in range(v):
            if p[j] < 0:
                return NEGATIVE, 0
        return ABOVE_ONE, 0
    if hi >= _HI_LIMIT:
        return SUM_TWO, 0
    s = (hi << 32) + lo
    if s >= S_LIMIT:
        return SUM_TWO, 0
    if s <= 0:
        return ZERO_MASS, 0
    return OK, s


@jit
def scan_round(p, c_x, draft, u_acc, psums, totals):
    """(verdict, row, accepted) for one request: rows p [D+1, V] in order, each checked and
    summed when the round reaches it, ratio tests until the first rejection (else the
    bonus row D). ``psums`` [D+1, blocks] and ``totals`` [D+1] receive each reached row's
    block sums and S; ``row`` is the row a refusal comes from."""
    depth = c_x.size
    for i in range(depth + 1):
        verdict, s = scan_row(p[i], psums[i])
        if verdict != OK:
            return verdict, i, 0
        totals[i] = s
        if i == depth:
            break
        if not accepts(u_acc[i], c_x[i], fixed(p[i, draft[i]]), s):
            return OK, i, i
    return OK, depth, depth


@jit
def _threshold(sums, s_total, u53):
    """(t, underflow): the draw's threshold t in [0, W) over the residual block sums
    ``sums`` (fixed.draw_threshold); W == 0 (underflow) draws over P itself: the caller
    then restores ``sums`` from psums and walks P without q."""
    w = np.int64(0)
    for k in range(sums.size):
        w += sums[k]
    under = w == 0
    if under:
        w = s_total
    hi, lo = mul_wide(u53, w)
    return shift_wide(hi, lo, U53_BITS), under


@jit
def _chosen_block(sums, t):
    """(block, mass before it): the block the threshold ``t`` falls in."""
    cum = np.int64(0)
    b = 0
    while b < sums.size and cum + sums[b] <= t:
        cum += sums[b]
        b += 1
    return b, cum


@jit
def pick(p, s_total, psums, sums, q_ids, q_counts, use_q, u53):
    """(id, underflow): the residual pick (residual.sample_fixed) on one row p [V] with
    total S and block sums ``psums``; ``sums`` is scratch of psums' size. Sparse q rows
    (ascending ids) apply where ``use_q``; W == 0 picks from P itself, flagged. Returns id
    -1 if the walk ran past the row (unreachable; the caller refuses it)."""
    v = p.size
    sums[:] = psums
    if use_q:
        for e in range(q_ids.size):
            j = q_ids[e]
            sums[j // BLOCK] -= min(fixed(p[j]), q_units(q_counts[e], s_total))
    t, under = _threshold(sums, s_total, u53)
    if under:  # pick from p itself with the same draw (pp1q.core.verify's rule)
        sums[:] = psums
        use_q = False
    b, cum = _chosen_block(sums, t)
    start = b * BLOCK
    e = np.searchsorted(q_ids, start) if use_q else q_ids.size
    for j in range(start, min(v, start + BLOCK)):
        r = fixed(p[j])
        if e < q_ids.size and q_ids[e] == j:
            r -= min(r, q_units(q_counts[e], s_total))
            e += 1
        cum += r
        if cum > t:
            return j, under
    return -1, under


@jit
def _dense_count(q, j):
    """The count of entry j of a validated dense FP32 q row: q * 2^24, an exact integer."""
    return np.int64(np.float64(q[j]) * _MASS)


@jit
def _dense_overlap(p, q, s_total):
    """sum over the slice of min(P_j, floor(c_j S / 2^24)), c_j = q_j * 2^24 (0 where q
    is): what q takes from one block of P. Indices from 0 and no branch: vectorised as
    ``_block`` is."""
    taken = np.int64(0)
    for j in range(p.size):
        taken += min(fixed(p[j]), q_units(_dense_count(q, j), s_total))
    return taken


@jit
def pick_dense(p, s_total, psums, sums, q, u53):
    """``pick`` with q a validated dense FP32 row (at least V entries, q * 2^24 an integer
    count each; pp1q.core.q_parse.validate_dense): the same integers and the same id,
    without extracting the row's support first."""
    v = p.size
    for k in range(sums.size):
        lo, hi = k * BLOCK, min(v, (k + 1) * BLOCK)
        sums[k] = psums[k] - _dense_overlap(p[lo:hi], q[lo:hi], s_total)
    t, under = _threshold(sums, s_total, u53)
    if under:
        sums[:] = psums
    b, cum = _chosen_block(sums, t)
    for j in range(b * BLOCK, min(v, (b + 1) * BLOCK)):
        r = fixed(p[j])
        if not under:
            r -= min(r, q_units(_dense_count(q, j), s_total))
        cum += r
        if cum > t:
            return j, under
    return -1, under
