"""glibc malloc thresholds for a daemon, set from inside the process.

A dense row at 129280 tokens makes temporaries of 0.5-1 MB (build_row's weights and
counts, the decider's work rows). glibc hands allocations above its mmap threshold
(128 KiB at start, raised only after a free) fresh pages from mmap, and every page
faults again on first touch: build_row of one dense row took 4.2 ms with ~1,340 page
faults, 2.3 ms with none once the thresholds below keep those temporaries on the heap
(BENCHMARKS.md). glibc reads ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_``
only at process start, so a daemon started from a shell or a systemd unit sets them
itself with mallopt; an operator's own value in the environment wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping

# temporaries up to this size come from the heap, not from fresh (page-faulting) mmaps
MMAP_THRESHOLD_BYTES = 256 << 20
# freed heap up to this stays mapped for the next round instead of going back to the OS
TRIM_THRESHOLD_BYTES = 512 << 20
ENV = {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD_BYTES,
       "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD_BYTES}
_PARAM = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_MMAP_THRESHOLD_": -3}  # M_* of malloc.h


def tune(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Set each threshold the environment leaves unset; the names set (none where the C
    library is not glibc, or mallopt refuses)."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): their allocators differ
        return []
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return [name for name, value in ENV.items()
            if name not in environ and mallopt(_PARAM[name], value) == 1]
