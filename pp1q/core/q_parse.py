"""Wire forms -> counts: the receiver's only way in, no renormalisation anywhere.

Every dyadic24 check of a received dense or sparse q row (the design's list: ids in
range, no duplicates, ascending, no zero entries, finite, non-negative, multiples of
2^-24, the exact mass, zero padding), by pp1q.core.q_backend's fused kernels where it
chose numba, else numpy's passes: the same decisions and reasons. Import them from
pp1q.core.q (or the stable pp1q.q), which re-exports them.
"""

from __future__ import annotations

import numpy as np

from pp1q.core import q_backend
from pp1q.core.errors import Reason, RowValidationError
from pp1q.core.q_row import _MASS_F32, _ONE_BITS, MASS, DyadicRow, _check_support

_I4, _F4 = np.dtype("<i4"), np.dtype("<f4")  # the wire's id and q element types


def _as_array(values, dtype: np.dtype, what: str) -> np.ndarray:
    """A 1-D array of ``dtype`` (a little-endian 4-byte type) from an array or LE bytes."""
    if type(values) is np.ndarray:  # first: what decoded frames carry, once per row
        arr = values
    elif isinstance(values, (bytes, bytearray, memoryview)):
        if len(values) % 4:
            raise RowValidationError(Reason.UNEXPECTED_SIZE, f"{what}: {len(values)} bytes")
        return np.frombuffer(values, dtype=dtype)
    else:
        arr = np.asarray(values)
    if arr.dtype != dtype or arr.ndim != 1:
        raise RowValidationError(Reason.UNEXPECTED_SIZE, f"{what}: need 1-D {dtype}")
    return arr


def _counts_from_q(q: np.ndarray) -> np.ndarray:
    """Recover integer counts from FP32 q values; refuse anything not c/2^24."""
    bits = q.view(np.uint32)
    # One unsigned compare covers sign, NaN/inf and q > 1: every legal value is a
    # non-negative FP32 whose bit pattern is at most that of 1.0.
    bad = bits > _ONE_BITS
    if bad.any():
        v = q[np.flatnonzero(bad)[0]]
        if not np.isfinite(v):
            raise RowValidationError(Reason.NON_FINITE, f"q value {v}")
        if np.signbit(v):
            raise RowValidationError(Reason.NEGATIVE_VALUE, f"q value {v}")
        raise RowValidationError(Reason.WRONG_MASS, f"q value {v} > 1")
    scaled = q * _MASS_F32  # exact: a power-of-two scale of a value <= 1
    counts = scaled.astype(np.int64)
    if not np.array_equal(counts, scaled):
        raise RowValidationError(Reason.NON_DYADIC, "q value not a multiple of 2^-24")
    total = int(counts.astype(np.uint64).sum(dtype=np.uint64))
    if total != MASS:
        raise RowValidationError(Reason.WRONG_MASS, f"counts sum to {total}, not {MASS}")
    return counts


# entries per validation chunk: few numpy calls per row, yet each scratch buffer stays
# under glibc's 128 KiB mmap threshold, so it is recycled instead of page-faulted in
_CHUNK = 32000


def validate_dense(q, vocab: int, checked: bool = False) -> np.ndarray:
    """Every check of ``parse_dense`` without building the row; returns the FP32 view.

    One fused numba pass where pp1q.core.q_backend chose it (same decisions, same
    reasons), else ``_validate_dense_numpy``. ``checked``: ``q_backend.copy_scanned``
    passed every value of ``q`` as it copied them in (all legal, the mass exact over
    the whole array); then only the padding is left: zero, the row is valid as it is;
    not zero, the full check below finds the reason.
    """
    arr = _as_array(q, _F4, "dense q")
    if arr.size < vocab:
        raise RowValidationError(Reason.UNEXPECTED_SIZE, f"dense q has {arr.size} < {vocab}")
    if checked and (arr.size == vocab or not arr.view(np.uint32)[vocab:].any()):
        return arr  # (no padding: no reduction call, ~1.5 us even over nothing)
    k = q_backend.kernels_for(arr)
    if k is None:
        return _validate_dense_numpy(arr, vocab)
    q_backend.validate_fused(k, arr, vocab)
    return arr


def _validate_dense_numpy(arr: np.ndarray, vocab: int) -> np.ndarray:
    """numpy's passes (``arr`` FP32, at least ``vocab`` values). A dense row is 129280
    values: whole-row temporaries would cost more than the checks (allocation and page
    faults), so the dyadic and mass checks stream through small scratch buffers after
    one max over the bit patterns."""
    bits = arr.view(np.uint32)
    if bits.size and bits.max() > _ONE_BITS:
        _counts_from_q(arr)  # raises with the precise reason (non-finite, negative, > 1)
    if arr.size > vocab and bits[vocab:].any():
        raise RowValidationError(Reason.PADDING_NONZERO, "dense padding beyond vocab is not zero")
    n = min(_CHUNK, vocab)
    scaled, back = np.empty(n, np.float32), np.empty(n, np.float32)
    counts = np.empty(n, np.int32)
    total = 0
    for lo in range(0, vocab, _CHUNK):
        x = arr[lo:min(lo + _CHUNK, vocab)]
        s, c, b = scaled[:x.size], counts[:x.size], back[:x.size]
        np.multiply(x, _MASS_F32, out=s)  # exact: a power-of-two scale of values in [0, 1]
        np.copyto(c, s, casting="unsafe")  # truncation; <= 2^24 fits and converts back
        np.copyto(b, c, casting="unsafe")
        if not np.array_equal(b, s):  # a value < 2^-24 truncates to 0 and differs too
            raise RowValidationError(Reason.NON_DYADIC, "q value not a multiple of 2^-24")
        total += int(c.sum(dtype=np.int64))
    if total != MASS:
        raise RowValidationError(Reason.WRONG_MASS, f"counts sum to {total}, not {MASS}")
    return arr


def parse_dense(q, vocab: int) -> DyadicRow:
    """Dense FP32 q (array or LE bytes). Length ``vocab``, or longer with zero padding."""
    return dense_row_of_valid(validate_dense(q, vocab), vocab)


def dense_row_of_valid(arr: np.ndarray, vocab: int) -> DyadicRow:
    """The ``DyadicRow`` of an FP32 row ``validate_dense`` returned, not checked again:
    the verifier validates each dense row on arrival (in a read-only frame buffer) and
    reads it in place (``DyadicRow.dense_q``: any token's count is one read of it): ids
    and counts are extracted only when something reads them (a writeable ``arr`` is
    extracted at once)."""
    if arr.flags.writeable:  # its owner could change it under the row: extract now
        return DyadicRow._proven(vocab, *_support_of_valid(arr, vocab))
    return DyadicRow._in_place(vocab, arr, _support_of_valid)


def _support_of_valid(arr: np.ndarray, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(int32 ids, int64 counts) of a dense FP32 row validate_dense accepted."""
    k = q_backend.kernels_for(arr)
    if k is not None:
        return q_backend.extract(k, arr, vocab)
    ids = np.flatnonzero(arr.view(np.uint32)[:vocab] != 0)  # bool nonzero: fast path
    counts = (arr[ids] * _MASS_F32).astype(np.int64)  # exact integers, proven above
    return ids.astype(np.int32), counts


def parse_sparse(ids, q, vocab: int, token: int | None = None) -> DyadicRow:
    """Sparse (int32 ids, FP32 q), each as array or LE bytes; canonical support only.

    ``token``: the token this row proposed, which must hold q > 0 (``require_token``'s
    checks, made after the row's): one kernel call for both on the numba path."""
    id_arr = _as_array(ids, _I4, "sparse ids")
    q_arr = _as_array(q, _F4, "sparse q")
    if id_arr.size != q_arr.size:
        raise RowValidationError(Reason.UNEXPECTED_SIZE, "sparse ids and q differ in length")
    if id_arr.size == 0:
        raise RowValidationError(Reason.MISSING_Q, "empty sparse row")
    k = q_backend.kernels_for(id_arr, q_arr)
    if k is None:
        _check_support(id_arr, vocab, RowValidationError)
        counts = _counts_from_q(q_arr)  # int64, contiguous
        if not counts.all():
            raise RowValidationError(Reason.NON_CANONICAL, "sparse entry with zero q")
        id_arr = np.ascontiguousarray(id_arr)  # int32 already
        checked = -1
    else:  # same checks, one call; a token outside the vocabulary is refused below
        checked = token if token is not None and 0 <= token < vocab else -1
        counts = q_backend.parse_sparse_fused(k, id_arr, q_arr, vocab, checked)
    # every invariant of DyadicRow is proven above: skip re-checking it
    row = DyadicRow._proven(vocab, id_arr, counts)
    if token is not None and checked < 0:
        row.require_token(token)
    return row


def parse_sparse_rows(words: np.ndarray, entries, tokens, vocab: int) -> list[DyadicRow]:
    """A PROPOSAL's rows (pp1q.wire.proposal's payload: int32 ``words``, each row its
    ids then its FP32 q, ``entries[i]`` each), each held to ``parse_sparse``'s checks
    with ``tokens[i]`` (in range: the caller's check) holding q > 0; one kernel call for
    every row on the numba path. The first failing row raises what ``parse_sparse``
    raises for it."""
    q_words = words.view(_F4)
    k = q_backend.kernels_for(words)
    counts = None
    if k is not None and all(entries):  # an empty row: parse_sparse's refusal (missing_q)
        counts = np.empty(len(words) // 2, np.int64)
        at_token = np.empty(len(entries), np.int64)
        code, failed, _ = k.sparse_rows(words, q_words, np.array(entries, np.int64),
                                        np.array(tokens, np.int64), vocab, counts, at_token)
        if code != k.OK:
            counts = None  # the row that failed is parsed alone below, for its reason
    if counts is None:  # numpy, or a refusal: every row as parse_sparse checks it
        rows, at = [], 0
        for n, token in zip(entries, tokens, strict=True):
            rows.append(parse_sparse(words[at:at + n], q_words[at + n:at + 2 * n], vocab, token))
            at += 2 * n
        return rows
    rows, at, c = [], 0, 0
    for n, token, c_x in zip(entries, tokens, at_token.tolist(), strict=True):
        # every invariant of DyadicRow is proven by the kernel, and the count at the
        # token found: the verifier's ratio test reads it without another search
        rows.append(DyadicRow._proven(vocab, words[at:at + n], counts[c:c + n], (token, c_x)))
        at += 2 * n
        c += n
    return rows
