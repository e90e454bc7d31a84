"""Recycled payload buffers: a dense row is 517 KB, and a fresh buffer per frame costs
more in page faults than the copy into it. A buffer goes back into use only when no
view of it is alive anywhere (CPython reference counts are exact), so a consumer may
keep a decoded row as long as it wants: the pool then allocates another."""

from __future__ import annotations

import sys

import numpy as np

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
        same = self._bufs.setdefault(nbytes, [])
        for i in range(len(same)):
            if sys.getrefcount(same[i]) <= _IDLE_REFS:  # nothing outside holds it
                buf = same[i]
                buf.flags.writeable = True
                return buf
        buf = np.empty(nbytes, dtype=np.uint8)
        self.allocations += 1
        if self.retained + nbytes <= self.max_bytes:
            same.append(buf)
            self.retained += nbytes
        return buf
