"""Recycled payload buffers: a dense row is 517 KB, and a fresh buffer per frame costs
more in page faults than the copy into it. A buffer goes back into use only when no
view of it is alive anywhere (CPython reference counts are exact), so a consumer may
keep a decoded row as long as it wants: the pool then allocates another."""

from __future__ import annotations

import sys

import numpy as np

from pp1q.core import q_backend
from pp1q.core.q import MASS, DyadicRow

POOL_MIN_BYTES = 64 * 1024  # smaller payloads come from malloc's heap without page faults
_IDLE_REFS = sys.getrefcount(np.empty(0)) + 1  # refs of a buffer only the pool's list holds


class PayloadPool:
    """Buffers keyed by exact size, at most ``max_bytes`` of them retained."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.retained = 0
        self._bufs: dict[int, list[np.ndarray]] = {}
        self.allocations = 0  # buffers ever allocated (a reuse test and a metric)

    def preallocate(self, nbytes: int, count: int) -> None:
        """Allocate and touch ``count`` buffers of ``nbytes`` now (start-up, not mid-round)."""
        for _ in range(count):
            if self.retained + nbytes > self.max_bytes:
                break
            buf = np.zeros(nbytes, dtype=np.uint8)  # zeros: pages are faulted in here
            buf[::4096] = 0
            self._bufs.setdefault(nbytes, []).append(buf)
            self.retained += nbytes
            self.allocations += 1
        del buf

    def take(self, nbytes: int) -> np.ndarray:
        """A writable uint8 buffer of exactly ``nbytes`` (bounds are checked by the caller)."""
        if nbytes < POOL_MIN_BYTES:
            return np.empty(nbytes, dtype=np.uint8)
        # a size gets its list only when a buffer of it is retained: a peer whose frames
        # take many sizes (PROPOSALs, CONTEXTs) past the cap adds nothing here
        same = self._bufs.get(nbytes, ())
        for i in range(len(same)):
            if sys.getrefcount(same[i]) <= _IDLE_REFS:  # nothing outside holds it
                buf = same[i]
                buf.flags.writeable = True
                return buf
        buf = np.empty(nbytes, dtype=np.uint8)
        self.allocations += 1
        if self.retained + nbytes <= self.max_bytes:
            self._bufs.setdefault(nbytes, []).append(buf)
            self.retained += nbytes
        return buf


SCATTER_CLEAR_RATIO = 16  # clear by index below 1/16 of the row; measured: a memset wins above
_MASS_F32 = np.float32(MASS)  # q = count / 2^24, exact in FP32
_WHOLE = np.empty(0, dtype=np.int32)  # ZeroRow._ids after a whole-row write: any entry may be set


class ZeroRow:
    """One dense FP32 row reused for building dense REPLYs.

    A fresh zeroed 517 KB row per REPLY costs a calloc (page faults when it is mmap'd)
    and a full pass. A row that holds its whole FP32 q (``DyadicRow.dense_q``: every
    dense row the worker drafts, build_row wrote it) is sent as it is: ``fill`` returns
    that read-only q itself when it is already ``n`` long, or copies it over this row
    and zeroes the padding after it. Any other row is scattered from its support into
    zeros: the previous fill's support is cleared first (or the whole row with one
    memset when that support was wide or unknown), one numba pass where
    pp1q.core.q_backend chose numba (numpy's fancy-index store of an 86k-entry support
    took 0.29 ms), else numpy's; both write the same bits: count / 2^24 is exact in FP32.
    The row returned is valid until the next ``fill``: encode the frame before that.
    """

    def __init__(self) -> None:
        self._row = np.zeros(0, dtype="<f4")
        self._ids: np.ndarray | None = None  # entries possibly nonzero: None = none

    def fill(self, n: int, row: DyadicRow) -> np.ndarray:
        """The ``n`` values of ``row``'s dense q: q = count / 2^24 at its ids, zero
        elsewhere (``n >= row.vocab``, the caller's check)."""
        whole = row.dense_q()
        if whole is None:
            return self._scatter(n, row.ids, row.counts)
        if whole.size == n:
            return whole  # read-only and never rewritten: nothing to copy
        if self._row.size != n:
            self._row = np.empty(n, dtype="<f4")  # every entry is written below
        self._ids = _WHOLE  # set first: a failed write leaves a row cleared by memset next
        self._row[:whole.size] = whole
        self._row[whole.size:] = 0
        return self._row

    def _scatter(self, n: int, ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        if self._row.size != n:
            self._row = np.zeros(n, dtype="<f4")
        elif self._ids is _WHOLE or (self._ids is not None
                                     and self._ids.size * SCATTER_CLEAR_RATIO >= n):
            self._row.fill(0)  # a wide or unknown support: one memset beats a scattered clear
        elif self._ids is not None:
            self._row[self._ids] = 0
        self._ids = None  # cleared first: a failed write below leaves no stale support
        k = q_backend.kernels_for(ids, counts)
        if k is None:
            self._row[ids] = counts.astype(np.float32) / _MASS_F32
        else:
            k.scatter(self._row, ids, counts)
        self._ids = ids
        return self._row


class ZeroRows:
    """ZeroRows for frames written without a copy (``encode_parts``, writelines): a row
    handed to the transport is filled again only once the transport has drained (every
    byte queued so far is in the kernel), so no payload is rewritten while a write may
    still read it. Rows exist as many as frames the writer may hold unsent: bounded by
    its write high-water mark (pp1q.worker.connection) plus one loop tick of frames."""

    def __init__(self) -> None:
        self._free: list[ZeroRow] = []
        self._lent: list[ZeroRow] = []  # handed out since the transport last drained

    def take(self, drained: bool) -> ZeroRow:
        """A row to fill now; ``drained``: nothing handed out before is still queued."""
        if drained:
            self._free += self._lent
            self._lent = []
        row = self._free.pop() if self._free else ZeroRow()
        self._lent.append(row)
        return row

    def __len__(self) -> int:
        return len(self._free) + len(self._lent)
