"""build_counts' CPU passes in numba: its exact total's limbs and its top-k positions.

``sum_limbs``: ``fixed.sum_limbs`` row by row in one pass, the same limbs operation for
operation (a = x 2^45, hi = floor(a), lo = floor((a - hi) 2^45), each exact, summed as
integers), so the total ``limbs_to_float`` makes of them is the same float64 bit for
bit; the torch form makes about six passes over a float64 row and writes three
temporaries (0.6-0.7 ms a 129280-entry row on the reference machine; this, one read).
``top_positions``: ``topk.select_positions``' rule in one pass a row (a heap of the k
best, checked 64 values at a time), instead of torch.topk and five whole-row
temporaries. tests/kernels/test_kernels_counts_cpu.py holds each to its torch form.

Imported only by pp1q_kernels.cpu_rows (the gate counts and topk share), when
pp1q.core.q_backend's choice is numba (the choice that runs build_row's allocation:
build_counts on the CPU follows it).
"""

from __future__ import annotations

import numpy as np

from .numba_step import jit

SUM_SCALE = 2.0**45  # fixed._SUM_SCALE (fixed.SUM_LIMB_BITS = 45)


@jit
def sum_limbs(x, hi, lo):
    """hi[r], lo[r]: fixed.sum_limbs of row r of ``x`` [n, V] (float64 in [0, 1], V at
    most fixed.SUM_MAX_ENTRIES: the caller's checks)."""
    for r in range(x.shape[0]):
        h_sum = np.int64(0)
        l_sum = np.int64(0)
        for i in range(x.shape[1]):  # no branch: LLVM vectorises it
            a = x[r, i] * SUM_SCALE  # exact: a power-of-two scale
            h = np.floor(a)
            h_sum += np.int64(h)
            l_sum += np.int64(np.floor((a - h) * SUM_SCALE))  # exact: a's fraction, rescaled
        hi[r] = h_sum
        lo[r] = l_sum


# heap insertions a row may make, n // _INSERT_SHARE + _INSERT_PER_K * k, before torch's
# topk decides it: a row in random order makes about k ln(n / k) (266 for k = 32 of
# 129280), one sorted ascending n (n log k sifts)
_INSERT_SHARE = 16
_INSERT_PER_K = 16
_BLOCK = 64  # values checked at once (one vector pass) before any is looked at alone


@jit
def _worse(v, i, w, j):
    """(v, i) ranks below (w, j): a smaller value, or an equal one at a higher position."""
    return v < w or (v == w and i > j)


@jit
def _sift_down(hv, hp, k, a):
    """Move entry ``a`` down the heap (its worst entry at 0) until it ranks below neither
    child: after the root was replaced, or to build the heap bottom-up."""
    while True:
        lo = 2 * a + 1
        if lo >= k:
            return
        c = lo
        if lo + 1 < k and _worse(hv[lo + 1], hp[lo + 1], hv[lo], hp[lo]):
            c = lo + 1
        if not _worse(hv[c], hp[c], hv[a], hp[a]):
            return
        hv[a], hv[c] = hv[c], hv[a]
        hp[a], hp[c] = hp[c], hp[a]
        a = c


@jit
def top_positions(values, k, out):
    """out[r]: the positions (ascending) of row r's k largest values, ties by lowest
    position (topk.select_positions' rule), in one pass a row: a heap of the k best so
    far, whose worst entry a later value replaces only by being larger (a later equal
    value sits at a higher position). Returns how many rows it gave up on (a NaN, which
    torch.topk ranks above everything, or more insertions than its budget above);
    the caller's torch form decides those."""
    n = values.shape[1]
    hv = np.empty(k, values.dtype)
    hp = np.empty(k, np.int64)
    given_up = 0
    for r in range(values.shape[0]):
        row = values[r]
        nan = False
        for i in range(k):  # the first k, then heapified
            hv[i] = row[i]
            hp[i] = i
            nan |= row[i] != row[i]
        if nan:  # no order to keep: torch's form ranks the NaN
            given_up += 1
            continue
        for a in range(k // 2 - 1, -1, -1):
            _sift_down(hv, hp, k, a)
        inserts, budget = 0, n // _INSERT_SHARE + _INSERT_PER_K * k
        worst = hv[0]
        for start in range(k, n, _BLOCK):
            end = min(start + _BLOCK, n)
            beats = 0
            for i in range(start, end):  # vectorised: does anything here beat the worst?
                beats += not row[i] <= worst  # (NaN too)
            if beats == 0:  # the usual case once the heap holds large values
                continue
            for i in range(start, end):
                v = row[i]
                if not v <= worst:
                    if v != v:
                        nan = True
                        break
                    hv[0] = v
                    hp[0] = i
                    _sift_down(hv, hp, k, 0)
                    worst = hv[0]
                    inserts += 1
            if nan or inserts > budget:
                break
        if nan or inserts > budget:
            given_up += 1
            continue
        out[r, :] = np.sort(hp)
    return given_up
