"""Capture files: every wire frame a daemon sent or received, with direction,
connection id and a monotonic timestamp, in a versioned record format
(docs/capture.md). ``pp1q replay`` (pp1q.tools.replay) decodes and replays them.

Stable surface: ``CaptureWriter``, ``CaptureReader``, ``read_capture``,
``CaptureError``, ``Record``, ``Header``, ``Role``, ``Kind``, ``Direction``,
``Protocol``, ``tap`` (record an asyncio protocol's connections), ``write_records``,
``FORMAT_VERSION``, ``MAGIC``.
"""

from pp1q.runtime.capture.format import (
    FORMAT_VERSION,
    MAGIC,
    SUFFIX,
    Direction,
    Kind,
    Protocol,
    Role,
)
from pp1q.runtime.capture.reader import CaptureError, CaptureReader, Header, Record, read_capture
from pp1q.runtime.capture.tap import tap
from pp1q.runtime.capture.writer import CaptureWriter, write_records

__all__ = [
    "FORMAT_VERSION", "MAGIC", "SUFFIX", "CaptureError", "CaptureReader", "CaptureWriter",
    "Direction", "Header", "Kind", "Protocol", "Record", "Role", "read_capture", "tap",
    "write_records",
]
