"""build_counts' CPU passes in numba: its exact total's limbs and its top-k positions.

``sum_limbs``: ``fixed.sum_limbs`` row by row in one pass, the same limbs operation for
operation (a = x 2^45, hi = floor(a), lo = floor((a - hi) 2^45), each exact, summed as
integers), so the total ``limbs_to_float`` makes of them is the same float64 bit for
bit; the torch form makes about six passes over a float64 row and writes three
temporaries (0.6-0.7 ms a 129280-entry row on the reference machine; this, one read).
``take_top``: ``topk.select_positions``' rule after torch.topk's k-th value, one pass a
row instead of five whole-row temporaries. tests/kernels/test_kernels_counts_cpu.py
holds each to its torch form.

Imported only by pp1q_kernels.counts and pp1q_kernels.topk, when pp1q.core.q_backend's
choice is numba (the choice that runs build_row's allocation: build_counts on the CPU
follows it).
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


@jit
def take_top(values, kth, k, out):
    """out[r]: the positions (ascending) of row r's values above kth[r], then of its
    values equal to kth[r] from the lowest position, k in all (topk.select_positions'
    rule, in one pass a row). Returns how many rows did not give exactly k (kth not a
    value of the row, NaN: the caller's torch form then says why)."""
    short = 0
    for r in range(values.shape[0]):
        t = kth[r]
        above = 0
        for i in range(values.shape[1]):  # counted first: how many ties are taken
            above += values[r, i] > t
        ties = k - above
        j = 0
        for i in range(values.shape[1]):
            v = values[r, i]
            if v > t or (v == t and ties > 0):
                if j < k:
                    out[r, j] = i
                j += 1
                if v == t:
                    ties -= 1
        short += j != k
    return short
