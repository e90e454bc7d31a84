"""Which implementation checks q rows: fused numba kernels, or numpy's passes (a dense
row: one pass instead of about ten; a sparse row: one call instead of about fifteen).

Both make exactly the same decision (accept or refuse, and the same closed-set
``Reason``): tests/core/test_q_backends.py feeds both the same corpus of bad rows
and random rows. The fused pass is several times faster (BENCHMARKS.md, "Wire v2"):
numpy needs about ten passes over a 517 KB row where one suffices.

The choice is made once per process, from the environment variable ``PP1Q_VALIDATE``:

- ``auto`` (default, also when unset): numba when it imports (the ``fast`` extra),
  else numpy. Which one runs, and why, is in the daemons' start-up log line ("q
  rows checked by numba (PP1Q_VALIDATE=auto), loaded in 1.9 s").
- ``numba``: numba or a ``ConfigError`` (never quietly numpy).
- ``numpy``: numpy's passes.

Nothing is imported or compiled until the first q row or ``warm_up()``; the daemons
call ``warm_up()`` at start where q rows can arrive (pp1q.runtime.warmup), so the
first frame does not pay numba's import and the kernel load (1-2 s on the reference
machine; the compiled kernels are cached in ``__pycache__``, compiling them afresh takes
a few seconds more).
"""

from __future__ import annotations

import importlib
import time

import numpy as np

from pp1q.core.backend_choice import BackendChoice
from pp1q.core.errors import DistributionError, Reason, RowValidationError
from pp1q.core.q_row import MASS

ENV = "PP1Q_VALIDATE"
CHOICE = BackendChoice(ENV, "numpy", lambda: importlib.import_module("pp1q.core.q_scan"))
chosen = CHOICE.chosen  # (backend, why, q_scan module or None), decided on the first call
select = CHOICE.select  # choose explicitly, as PP1Q_VALIDATE=want would (pp1q bench)


def backend() -> str:
    """'numba' or 'numpy': what checks q rows in this process."""
    return chosen()[0]


def kernels():
    """The numba kernels module, or None for the numpy path."""
    return chosen()[2]


def kernels_for(*arrays: np.ndarray):
    """The kernels if they run on these arrays (C-contiguous, native byte order: wire
    buffers on a little-endian host always are), else None: the numpy path then."""
    k = CHOICE.chosen()[2]  # kernels(), inlined: this runs once per received row
    if k is None:
        return None
    for a in arrays:  # a loop, not all(generator): this runs once per received row
        if not (a.flags.c_contiguous and a.dtype.isnative):
            return None
    return k


def warm_up() -> tuple[str, str, float]:
    """(backend, why, seconds): choose, import and load (or compile) the kernels for
    the array kinds rows arrive in (writable pool buffers, read-only bytes)."""
    t0 = time.perf_counter()
    name, why, k = chosen()
    if k is not None:
        row = np.zeros(8, np.float32)
        row[0] = 1.0
        ids = np.arange(8, dtype=np.int32)
        for arr, i in ((row, ids), (np.frombuffer(row.tobytes(), np.float32),
                                    np.frombuffer(ids.tobytes(), np.int32))):
            k.scan(arr, arr.view(np.uint32), 4)
            k.extract(arr, arr.view(np.uint32), 4)
            k.sparse(i, arr, 8, 0, np.empty(8, np.int64))
        one = np.array([1], np.int64)  # a PROPOSAL of one single-entry row, both kinds
        for words in (np.array([0, 0x3F800000], np.int32),
                      np.frombuffer(np.array([0, 0x3F800000], np.int32).tobytes(), np.int32)):
            k.sparse_rows(words, words.view(np.float32), one, one - 1, 8, np.empty(1, np.int64),
                          np.empty(1, np.int64))
        k.pack_sparse(ids, np.ones(8, np.int64), 0, np.empty(8, np.int32),
                      np.empty(8, np.float32))  # the worker's PROPOSAL rows
        k.scatter(np.zeros(8, np.float32), ids, np.ones(8, np.int64))  # dense REPLYs
        k.dense_from_counts(np.zeros(8, np.float32), np.ones(4, np.int32))  # and from counts
        w = np.full(4, 0.25)
        k.allocate(w, w.view(np.uint64), np.empty(4, np.int32))  # build_row's counts
        for arr in (row, np.frombuffer(row.tobytes(), np.float32)):
            k.first_past(arr, np.float32(1 << 24), 0)  # draws over a built or received q
        fed = bytes(1) + row.tobytes()  # a payload where a frame put it: any alignment,
        for buf in (fed, bytearray(fed)):  # in read-only bytes or a writable buffer
            for at in (0, 1):
                copy_scanned(np.empty(32, np.uint8), memoryview(buf)[at:at + 32])
    return name, why, time.perf_counter() - t0


def copy_scanned(dst: np.ndarray, src) -> bool:
    """Copy the bytes ``src`` (a multiple of 4) into the uint8 buffer ``dst`` of the same
    size. True: the numba kernel checked the FP32 values while copying them and every
    one is a count / 2^24 with the counts summing to 2^24 (``validate_dense(...,
    checked=True)`` then has only the padding left); False: nothing was checked (the
    numpy path, or a row that ``validate_dense`` refuses: it finds the reason)."""
    k = kernels()
    if k is None:
        dst[:] = src
        return False
    return k.copy_scan(np.frombuffer(src, np.uint32), dst.view(np.uint32))


def validate_fused(k, arr: np.ndarray, vocab: int) -> None:
    """Every check of ``validate_dense`` in one pass; ``arr`` a C-contiguous FP32 row of
    at least ``vocab`` values (the caller's checks)."""
    code, i, total = k.scan(arr, arr.view(np.uint32), vocab)
    if code == k.OK:
        return
    if code == k.MASS_WRONG:
        raise RowValidationError(Reason.WRONG_MASS, f"counts sum to {total}, not {1 << 24}")
    reason, what = k.FAILURES[code]
    raise RowValidationError(reason, f"{what} at index {i}: {arr[i]!r}")


def parse_sparse_fused(k, ids: np.ndarray, q: np.ndarray, vocab: int,
                       token: int = -1) -> np.ndarray:
    """The int64 counts of a sparse row after every check of ``parse_sparse`` in one
    kernel call; ``ids`` int32 and ``q`` FP32, C-contiguous, equal lengths, not empty.
    ``token`` (in range; -1: none): the proposed token, which must hold q > 0."""
    counts = np.empty(ids.size, np.int64)
    code, i = k.sparse(ids, q, vocab, token, counts)
    if code == k.OK:
        return counts
    if code == k.MASS_WRONG:
        total = int((q.astype(np.float64) * (1 << 24)).astype(np.int64).sum())  # all dyadic
        raise RowValidationError(Reason.WRONG_MASS, f"counts sum to {total}, not {1 << 24}")
    if code == k.ZERO_AT_TOKEN:
        raise RowValidationError(Reason.ZERO_Q_AT_TOKEN, f"q({token}) = 0")
    reason, what = k.FAILURES[code]
    raise RowValidationError(reason, f"{what} at index {i}: {(ids[i], q[i])!r}")


def allocate_fused(k, w: np.ndarray, counts: np.ndarray) -> int:
    """build_row's count allocation in one kernel call (``k.allocate``) into ``counts``
    (int32 or int64, w's size), ``w`` (normalised FP64, C-contiguous) consumed into its
    remainders; ``remaining``, or the refusal the kernel's verdict names."""
    remaining = k.allocate(w, w.view(np.uint64), counts)
    if remaining == -1:
        raise DistributionError(Reason.ALLOCATION_INCONSISTENT,
                                f"weights outside [0, 1] or remaining tickets not in "
                                f"[0, {MASS})")
    if remaining == -2:
        raise DistributionError(Reason.ALLOCATION_INCONSISTENT,
                                f"more tickets than the {int(np.count_nonzero(w >= 0))} "
                                "positive entries")
    return remaining


def extract(k, arr: np.ndarray, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(int32 ids, int64 counts) of a row ``validate_fused`` accepted."""
    return k.extract(arr, arr.view(np.uint32), vocab)
