"""The fused q-row kernels (numba): every dyadic24 check of a dense FP32 row in one
pass, its support extraction, a sparse row's checks in one call, and the other way
round, a dense REPLY's q written from a row's counts (``scatter`` from its support,
``dense_from_counts`` from build_row's whole-vocabulary counts), and build_row's count
allocation itself (``allocate``). Imported only by
pp1q.core.q_backend, and only when the numba backend is chosen: the one module of
pp1q/ that imports numba (pp1q_kernels' numba_* modules are the others).

``scan(q, bits, vocab)`` makes the checks of the numpy path (pp1q.core.q_parse) over ``q``
(FP32) and ``bits`` (the same memory as uint32) in one loop that keeps no branch per
entry: the running max of the bit patterns (an unsigned max covers sign, NaN, inf and
q > 1 at once: every legal value is a non-negative FP32 no greater than 1.0), whether
any x * 2^24 is not an integer, and the int64 sum of the counts. Only when something
failed does a second, cold loop find the first offending index, so the reason is the
one the numpy path gives, in the numpy path's order of checks: a value above 1.0's bit
pattern anywhere (the row's padding included), then nonzero padding, then a non-dyadic
value, then the mass. ``copy_scan`` is that loop storing each value as it reads it: a
dense payload the decoder copies out of the bytes fed is checked in the same pass (one
read of the row instead of two; only a pass is taken from it, refusals get ``scan``).
"""

from __future__ import annotations

import numba
import numpy as np

from pp1q.core.errors import Reason

# the kernels' verdicts; pp1q.core.q_backend maps each failure to its closed-set Reason
(OK, NON_FINITE_VALUE, NEGATIVE, ABOVE_ONE, PADDING, NON_DYADIC_VALUE, MASS_WRONG,
 ID_RANGE, DUPLICATE, UNSORTED, ZERO_COUNT, ZERO_AT_TOKEN) = range(12)
FAILURES = {  # code -> (Reason, what the entry at the index is); MASS_WRONG and
    # ZERO_AT_TOKEN (pp1q.core.q_backend words their details) have no index
    ID_RANGE: (Reason.ID_OUT_OF_RANGE, "support id outside the vocabulary"),
    DUPLICATE: (Reason.DUPLICATE_ID, "duplicate support id"),
    UNSORTED: (Reason.UNSORTED_SUPPORT, "support ids not ascending"),
    ZERO_COUNT: (Reason.NON_CANONICAL, "sparse entry with zero q"),
    NON_FINITE_VALUE: (Reason.NON_FINITE, "non-finite q value"),
    NEGATIVE: (Reason.NEGATIVE_VALUE, "negative q value"),
    ABOVE_ONE: (Reason.WRONG_MASS, "q value > 1"),
    PADDING: (Reason.PADDING_NONZERO, "dense padding beyond vocab is not zero"),
    NON_DYADIC_VALUE: (Reason.NON_DYADIC, "q value not a multiple of 2^-24"),
}

_ONE = np.uint32(0x3F800000)  # FP32 1.0: the largest legal q value
_EXP_ALL_ONES = np.uint32(0x7F800000)  # exponent field of inf and NaN
_SIGN = np.uint32(0x80000000)
_MASS = np.int64(1 << 24)
_MASS_F32 = np.float32(1 << 24)  # x * 2^24 is exact in FP32 for x in [0, 1]


def _jit(fn):
    """cache=True: a process loads the compiled kernel from __pycache__ (milliseconds)
    instead of compiling it (about a second). Where no cache folder is writable numba
    refuses caching at decoration: compile at every start then, still correct."""
    try:
        return numba.njit(cache=True, nogil=True, boundscheck=False)(fn)
    except RuntimeError:
        return numba.njit(nogil=True, boundscheck=False)(fn)


def _jit_inline(fn):
    """A helper compiled into its callers (numba's IR inlining): the hot loops stay one
    vectorisable body."""
    try:
        return numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")(fn)
    except RuntimeError:
        return numba.njit(nogil=True, boundscheck=False, inline="always")(fn)


@_jit
def _not_dyadic(x):
    """x (in [0, 1]) is not an integer multiple of 2^-24. A value below 2^-24 truncates
    to 0 and differs from its scaled self too (subnormals included)."""
    s = x * _MASS_F32
    return np.float32(np.int32(s)) != s


@_jit_inline
def _entry(b, x):
    """(count, odd) of one entry (bit pattern b, value x): its count if x = count / 2^24,
    and whether it is not. A value above 1.0's bit pattern (sign, NaN, inf, > 1) counts
    0 and is never converted: the running max of the patterns refuses it."""
    x = x if b <= _ONE else np.float32(0.0)
    s = x * _MASS_F32
    c = np.int32(s)
    return c, np.float32(c) != s


@_jit
def _stats(q, bits, lo, hi, top, odd, total):
    """``scan``'s hot loop over entries lo..hi, carrying (top, odd, total) on: the
    running max of the bit patterns, whether any value is not a count / 2^24, the sum
    of the counts."""
    for i in range(lo, hi):  # hot: no branch on the data, so LLVM vectorises it
        b = bits[i]
        top = max(top, b)
        c, o = _entry(b, q[i])
        odd |= o
        total += c
    return top, odd, total


@_jit
def copy_scan(src, dst):
    """Copy ``src`` into ``dst`` (FP32 values as uint32 bit patterns, equal sizes) and
    return whether the values pass ``scan`` over the whole of them (every value a
    count / 2^24, the counts summing to 2^24): a received dense row is then read once,
    not copied and scanned in two passes. Only a pass is conclusive; the padding
    beyond the vocabulary (zero for a legal row) and any refusal's reason are
    ``scan``'s to decide."""
    n = dst.size
    if src.size != n:
        raise ValueError("copy_scan: sizes differ")
    q = src.view(np.float32)
    top, odd, total = np.uint32(0), False, np.int64(0)
    for i in range(n):  # scan's hot loop, storing each value as it goes (one pass)
        b = src[i]
        dst[i] = b
        top = max(top, b)
        c, o = _entry(b, q[i])
        odd |= o
        total += c
    return top <= _ONE and not odd and total == _MASS


@_jit
def scan(q, bits, vocab):
    """(code, index, total): code OK or one of the failures above, the first index
    that fails (-1 for the mass), total the sum of the counts (valid when code is OK or
    MASS_WRONG). ``vocab <= bits.size`` is the caller's check, repeated here because
    bounds checking is off inside the loops."""
    n = bits.size
    if not 0 <= vocab <= n or q.size != n:
        raise ValueError("scan: vocab beyond the row")
    top, odd, total = _stats(q, bits, 0, vocab, np.uint32(0), False, np.int64(0))
    pad = np.uint32(0)
    for i in range(vocab, n):
        pad |= bits[i]
        top = max(top, bits[i])
    if top > _ONE:  # cold from here on: the row is refused
        for i in range(n):
            b = bits[i]
            if b > _ONE:
                if b & _EXP_ALL_ONES == _EXP_ALL_ONES:
                    return NON_FINITE_VALUE, i, total
                if b & _SIGN:
                    return NEGATIVE, i, total
                return ABOVE_ONE, i, total
    if pad:
        for i in range(vocab, n):
            if bits[i]:
                return PADDING, i, total
    if odd:
        for i in range(vocab):
            if _not_dyadic(q[i]):
                return NON_DYADIC_VALUE, i, total
    if total != _MASS:
        return MASS_WRONG, -1, total
    return OK, -1, total


@_jit
def extract(q, bits, vocab):
    """(int32 ids, int64 counts) of the nonzero entries of a row ``scan`` accepted."""
    if not 0 <= vocab <= bits.size or q.size != bits.size:
        raise ValueError("extract: vocab beyond the row")
    n = 0
    for i in range(vocab):
        n += bits[i] != 0
    ids = np.empty(n + 1, np.int32)  # one spare slot: the store below is unconditional
    counts = np.empty(n + 1, np.int64)
    j = 0
    for i in range(vocab):  # branch-free: write every entry, advance only past nonzeros
        ids[j] = i
        counts[j] = np.int64(q[i] * _MASS_F32)
        j += bits[i] != 0
    return ids[:n], counts[:n]


@_jit
def sparse(ids, q, vocab, token, counts):  # one call instead of ~15 numpy calls of ~1 us
    """(code, index) of a sparse row (int32 ids, FP32 q; equal lengths, at least one
    entry: the caller's checks), its int64 counts written into ``counts`` (as long).
    ``index``: where a check failed; on OK, the proposed token's entry (-1: no token).
    The numpy path's order: ids out of range, duplicate ids, unsorted ids, then the q
    checks as ``scan`` makes them, then a zero count (a support entry must hold q > 0),
    then (``token`` >= 0: the proposed token, in range) no support entry at ``token``.
    Per call costs dominate a k=32 row: the uint32 view of q is taken in here, and
    counts come in rather than out (returning an array boxes it: ~0.7 us a call)."""
    n = ids.size
    if n == 0 or q.size != n or counts.size != n:
        raise ValueError("sparse: ids, q and counts differ in length, or no entry")
    for i in range(n):
        if ids[i] < 0 or ids[i] >= vocab:
            return ID_RANGE, i
    dup = -1
    unsorted = -1
    for i in range(1, n):  # ids are in range: the difference cannot overflow
        if ids[i] == ids[i - 1] and dup < 0:
            dup = i
        elif ids[i] < ids[i - 1] and unsorted < 0:
            unsorted = i
    if dup >= 0:
        return DUPLICATE, dup
    if unsorted >= 0:
        return UNSORTED, unsorted
    code, i, total = scan(q, q.view(np.uint32), n)
    if code != OK:
        return code, i
    for i in range(n):
        counts[i] = np.int64(q[i] * _MASS_F32)
    for i in range(n):
        if counts[i] == 0:
            return ZERO_COUNT, i
    if token >= 0:
        j = np.searchsorted(ids, token)  # ascending, proven above
        if j == n or ids[j] != token:
            return ZERO_AT_TOKEN, -1
        return OK, j
    return OK, -1


@_jit
def scatter(row, ids, counts):
    """row[ids[j]] = counts[j] / 2^24 for every j: a dense REPLY's q written from a
    row's support in one pass (numpy's fancy-index store of an 86k-entry support took
    0.29 ms, most of a dense REPLY's building). Exact: a count (<= 2^24) is an FP32
    integer and the scale a power of two. Bounds checks are not compiled in, so the
    ids are checked first: nothing is written when one is outside the row."""
    n = row.size
    if ids.size != counts.size:
        raise ValueError("scatter: ids and counts differ in length")
    outside = False
    for j in range(ids.size):  # no branch per entry: vectorised (half the kernel's time)
        outside |= (ids[j] < 0) | (ids[j] >= n)
    if outside:
        raise ValueError("scatter: support id outside the row")
    for j in range(ids.size):
        row[ids[j]] = np.float32(counts[j]) / _MASS_F32


# -- a draw over a whole vocabulary's counts -----------------------------------------


_DRAW_BLOCK = 256  # entries summed at once (vectorised) before the draw looks inside


@_jit
def first_past(values, scale, u):
    """The first index whose running sum of int64(values[i] * scale) exceeds ``u``
    (values.size if none does): ``pp1q.core.q.sample`` over a row's whole vocabulary,
    its FP32 q (``DyadicRow.dense_q``, scale 2^24: exact), without the row's support
    extracted or a cumulative array written. Blocks of _DRAW_BLOCK entries are
    summed whole (no branch inside: LLVM vectorises it) until the one where the sum
    passes ``u``, which is walked entry by entry: 6 us instead of 47 at V = 129280."""
    n = values.size
    cum = np.int64(0)
    start = 0
    while start + _DRAW_BLOCK <= n:
        block = np.int64(0)
        for i in range(start, start + _DRAW_BLOCK):
            block += np.int64(values[i] * scale)
        if cum + block > u:
            break
        cum += block
        start += _DRAW_BLOCK
    for i in range(start, n):
        cum += np.int64(values[i] * scale)
        if cum > u:
            return i
    return n


# -- a dense REPLY's q from a whole vocabulary's counts ------------------------------

_INV_MASS_F32 = np.float32(1.0 / (1 << 24))  # times a count: count / 2^24, exactly


@_jit
def dense_from_counts(row, counts):
    """row[i] = counts[i] / 2^24 for i < counts.size, 0 after (any padding): build_row's
    FP32 q of a full-support row (a dense REPLY's payload as it is sent) in one
    sequential pass from its whole vocabulary's counts, nothing cleared first and no
    scatter (``scatter`` is for rows given by their support). Exact,
    the same bits as ``scatter``: a count (<= 2^24) is an FP32 integer and 2^-24 a power
    of two. Bounds checks are not compiled in: counts longer than the row are refused."""
    if counts.size > row.size:
        raise ValueError("dense_from_counts: more counts than the row holds")
    for i in range(counts.size):  # branch-free, so LLVM vectorises the conversion
        row[i] = np.float32(counts[i]) * _INV_MASS_F32
    for i in range(counts.size, row.size):
        row[i] = np.float32(0.0)


@_jit
def sparse_rows(words, qwords, entries, tokens, vocab, counts, at_token):
    """(code, row, index) of a PROPOSAL's rows, each checked as ``sparse`` checks one, in
    one call for the whole proposal: ``words`` the payload as int32 (each row its ids,
    then its q), ``qwords`` the same memory as FP32, ``entries`` each row's length,
    ``tokens`` each row's proposed token (in range: the caller's check), ``counts``
    (int64, one per entry) receives every row's counts in order, ``at_token`` (int64,
    one per row) each row's count at its token (the ratio test's c_x, found on the way).
    ``row`` is the first failing row (-1: none)."""
    rows = entries.size
    total = 0
    for r in range(rows):
        total += entries[r]
    if words.size != 2 * total or qwords.size != words.size or counts.size != total \
            or tokens.size != rows or at_token.size != rows:
        raise ValueError("sparse_rows: payload, counts and rows differ in size")
    at = 0
    c = 0
    for r in range(rows):
        n = entries[r]
        code, i = sparse(words[at:at + n], qwords[at + n:at + 2 * n], vocab, tokens[r],
                         counts[c:c + n])
        if code != OK:
            return code, r, i
        at_token[r] = counts[c + i] if i >= 0 else 0  # no token (< 0): no count
        at += 2 * n
        c += n
    return OK, -1, -1


@_jit
def pack_sparse(ids, counts, token, out_ids, out_q):
    """A sparse row's payload written where its frame will carry it: ``out_ids`` its ids,
    ``out_q`` count / 2^24 (exact in FP32, the bits ``DyadicRow.to_sparse`` gives).
    False when ``token`` is not in the support (a token its own q could not draw)."""
    n = ids.size
    if counts.size != n or out_ids.size != n or out_q.size != n:
        raise ValueError("pack_sparse: ids, counts and outputs differ in length")
    for i in range(n):
        out_ids[i] = ids[i]
        out_q[i] = np.float32(counts[i]) / _MASS_F32
    j = np.searchsorted(ids, token)  # ids ascending: a DyadicRow's invariant
    return j < n and ids[j] == token


# -- build_row's count allocation ------------------------------------------------------

_TICKET_BUCKETS = 1 << 12  # remainders in [0, 1) bucketed by 12 bits: one L1-sized table


_ONE_F64_BITS = np.uint64(0x3FF0000000000000)  # FP64 1.0: the largest weight
_NEG_ZERO_BITS = np.uint64(0x8000000000000000)


@_jit
def allocate(w, bits, counts):
    """build_row's rule (pp1q.core.q._allocate) in five passes: counts[i] = floor(w[i] *
    2^24), then one ticket for each of the ``remaining`` largest remainders among the
    entries with w > 0, ties by lowest index. ``w`` (normalised FP64; ``bits`` the same
    memory as uint64) is consumed: its entries become the remainders (-1 where w = 0:
    never a ticket). Returns ``remaining`` (>= 0), or -1 when an entry is outside
    [0, 1] or the floors leave no consistent remainder, -2 when more tickets remain
    than entries with w > 0 (the caller raises). The range check is a pass of its own
    (12 us): in the conversion loop it stopped LLVM vectorising it (350 us more).

    The ``remaining``-th largest remainder is found exactly without a sort of the row:
    a histogram of the remainders' top 12 fraction bits (r * 2^12 is exact, so the
    buckets keep the order) names the bucket that holds it, and only that bucket's
    values are sorted."""
    n = w.size
    outside = False  # an entry outside [0, 1], or NaN: not normalised weights (the
    for i in range(n):  # int32 conversion below is meaningful only inside)
        # a set sign bit or NaN is above 1.0's bits (-0.0 is a zero weight, as numpy's)
        outside |= (bits[i] > _ONE_F64_BITS) & (bits[i] != _NEG_ZERO_BITS)
    if outside:
        return -1
    total = 0
    for i in range(n):
        f = w[i] * 16777216.0  # exact: a power-of-two scale
        c = np.int32(f)  # truncation is floor for f >= 0
        counts[i] = c
        total += c
        w[i] = f - c if f > 0.0 else -1.0  # the remainder, exactly
    remaining = _MASS - total
    if remaining < 0 or remaining >= _MASS:
        return -1
    if remaining == 0:
        return 0
    hist = np.zeros(_TICKET_BUCKETS, np.int64)
    for i in range(n):
        if w[i] >= 0.0:
            hist[np.int64(w[i] * _TICKET_BUCKETS)] += 1
    above = 0  # entries in buckets above b
    b = _TICKET_BUCKETS - 1
    while b >= 0 and above + hist[b] < remaining:
        above += hist[b]
        b -= 1
    if b < 0:
        return -2
    vals = np.empty(hist[b], np.float64)
    j = 0
    for i in range(n):
        if w[i] >= 0.0 and np.int64(w[i] * _TICKET_BUCKETS) == b:
            vals[j] = w[i]
            j += 1
    vals.sort()
    kth = vals[vals.size - (remaining - above)]
    ties = remaining - above  # tickets left for values equal to kth, lowest index first
    for v in vals:
        if v > kth:
            ties -= 1
    for i in range(n):  # branch-free: half the entries win, unpredictably (20 vs 430 us)
        counts[i] += w[i] > kth
    i = 0
    while ties > 0 and i < n:  # ties are few: this branch is all but never taken
        if w[i] == kth:
            counts[i] += 1
            ties -= 1
        i += 1
    return remaining
