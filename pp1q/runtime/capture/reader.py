"""Reading a capture: every byte is checked, and a bad file is refused, saying where.

``CaptureReader(path)`` parses the file header at once and yields ``Record``s lazily
(a capture of dense traffic can be gigabytes). Every length is checked against its
kind's cap before a body is read; every record's checksum, kind, direction and
connection life cycle (OPEN before DATA/CLOSE, no reuse) is checked as it is read.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from pp1q.core.errors import Pp1qError, Reason
from pp1q.runtime.capture.format import (
    CHECKSUM,
    FILE_HEADER,
    FILE_HEADER_BYTES,
    FORMAT_VERSION,
    MAGIC,
    MAX_META_DEPTH,
    MAX_OPEN_CONNECTIONS,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    Direction,
    Kind,
    Role,
    cap_for,
    direction_for,
)
from pp1q.runtime.files import read_regular

READ_BUFFER_BYTES = 1 << 20  # sequential reads of many small records


class CaptureError(Pp1qError):
    """The file is not a valid capture (corrupt, truncated, unknown version...).

    ``offset``: byte offset of the offending record (or header); ``index``: its
    record number from 0, None for the file header.
    """

    def __init__(self, message: str, offset: int = 0, index: int | None = None) -> None:
        self.offset, self.index = offset, index
        where = "file header" if index is None else f"record {index}"
        text = f"{message} ({where} at byte {offset})"
        super().__init__(Reason.BAD_CAPTURE, text, message=text)


@dataclass(frozen=True, slots=True)
class Header:
    version: int
    role: Role
    start_unix_ns: int


@dataclass(frozen=True, slots=True)
class Record:
    index: int
    offset: int
    kind: Kind
    direction: Direction
    conn: int
    time_ns: int
    body: bytes
    meta: dict = field(default_factory=dict)  # decoded JSON body of OPEN/CLOSE/INFO


class CaptureReader:
    """Iterate the records of a capture. ``allow_truncated``: a file cut inside its
    last record (a daemon killed mid-write) ends cleanly there; ``truncated`` then
    tells, and every other defect is still refused."""

    def __init__(self, path: str | os.PathLike, *, allow_truncated: bool = False,
                 follow_s: float = 0.0) -> None:
        """``follow_s`` > 0: at the end of the file (or inside a record still being
        written) wait that long and read on, forever (``pp1q replay --follow``)."""
        self.path = Path(path)
        self.allow_truncated = allow_truncated
        self.follow_s = follow_s
        self.truncated: CaptureError | None = None
        raw, st = read_regular(self.path, FILE_HEADER_BYTES)
        self.size = st.st_size
        self.header = _parse_header(raw[:FILE_HEADER_BYTES])

    def __iter__(self) -> Iterator[Record]:
        with open(self.path, "rb", buffering=READ_BUFFER_BYTES) as f:
            f.seek(FILE_HEADER_BYTES)
            yield from self._records(f)

    def records(self) -> list[Record]:
        return list(self)

    def _records(self, f) -> Iterator[Record]:
        offset, index = FILE_HEADER_BYTES, 0
        conns = _Lifecycle()
        while True:
            head = f.read(RECORD_HEADER_BYTES)
            if len(head) < RECORD_HEADER_BYTES and self.follow_s:
                self._wait(f, offset)
                continue
            if not head:
                return
            if len(head) < RECORD_HEADER_BYTES:
                self._cut(f"truncated record header ({len(head)} of "
                          f"{RECORD_HEADER_BYTES} bytes)", offset, index)
                return
            kind, direction, conn, time_ns, length = _parse_record_head(head, offset, index)
            have = self.size - offset - RECORD_HEADER_BYTES
            if length > have and self.follow_s:
                self.size = os.fstat(f.fileno()).st_size
                if length > self.size - offset - RECORD_HEADER_BYTES:
                    self._wait(f, offset)  # the writer is inside this record
                    continue
                have = self.size - offset - RECORD_HEADER_BYTES
            if length > have:  # known from the file size: nothing is allocated for it
                self._cut(f"truncated record body ({have} of {length} bytes)", offset, index)
                return
            body = f.read(length)
            h = xxhash.xxh3_64(head[:RECORD_HEADER.size])
            h.update(body)
            if h.intdigest() != CHECKSUM.unpack_from(head, RECORD_HEADER.size)[0]:
                raise CaptureError("record checksum mismatch (corrupt capture)", offset, index)
            meta = {} if kind is Kind.DATA else _meta(body, offset, index)
            conns.check(kind, conn, offset, index)
            yield Record(index, offset, kind, direction, conn, time_ns, body, meta)
            offset += RECORD_HEADER_BYTES + length
            index += 1

    def _wait(self, f, offset: int) -> None:
        time.sleep(self.follow_s)
        f.seek(offset)  # drops the buffer: the next read sees what was appended
        self.size = os.fstat(f.fileno()).st_size

    def _cut(self, message: str, offset: int, index: int) -> None:
        err = CaptureError(message, offset, index)
        if not self.allow_truncated:
            raise err
        self.truncated = err


def _parse_header(raw: bytes) -> Header:
    if len(raw) < len(MAGIC) or raw[:len(MAGIC)] != MAGIC:
        raise CaptureError(f"not a pp1q capture (magic {raw[:len(MAGIC)]!r})")
    if len(raw) < FILE_HEADER_BYTES:
        raise CaptureError(f"truncated file header ({len(raw)} of {FILE_HEADER_BYTES} bytes)")
    magic, version, role, flags, reserved, start = FILE_HEADER.unpack_from(raw)
    if version != FORMAT_VERSION:
        raise CaptureError(f"capture format version {version}; this pp1q reads version "
                           f"{FORMAT_VERSION} (wire v2 revision 2 and later; version 1 files hold "
                           f"revision-1 sessions: re-record them)")
    if xxhash.xxh3_64_intdigest(raw[:FILE_HEADER.size]) != CHECKSUM.unpack_from(
            raw, FILE_HEADER.size)[0]:
        raise CaptureError("file header checksum mismatch (corrupt capture)")
    if role not in Role._value2member_map_:
        raise CaptureError(f"unknown role {role}")
    if flags or reserved:
        raise CaptureError(f"reserved header bits set (flags {flags:#x}, {reserved:#x})")
    return Header(version, Role(role), start)


def _parse_record_head(head: bytes, offset: int, index: int):
    kind, direction, flags, conn, time_ns, length, reserved = RECORD_HEADER.unpack_from(head)
    # the checksum is verified after the body; these checks bound what is read first
    if kind not in Kind._value2member_map_:
        raise CaptureError(f"unknown record kind {kind}", offset, index)
    kind = Kind(kind)
    if direction not in direction_for(kind):
        raise CaptureError(f"{kind.name} record with direction {direction}", offset, index)
    if flags or reserved:
        raise CaptureError("reserved record bits set", offset, index)
    if length > cap_for(kind):
        raise CaptureError(f"{kind.name} record of {length} bytes > {cap_for(kind)}",
                           offset, index)
    if (kind is Kind.INFO) != (conn == 0):
        raise CaptureError(f"{kind.name} record on connection {conn}", offset, index)
    return kind, Direction(direction), conn, time_ns, length


def _nesting(text: str) -> int:
    """The deepest [ / { nesting of ``text`` outside JSON strings: never less than the
    depth json.loads recurses to on it (it reads the same characters, and stops at the
    first one that is not JSON)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":  # the next character is escaped
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _meta(body: bytes, offset: int, index: int) -> dict:
    try:
        # UTF-8 first, and the scan and json.loads read the same text: given bytes,
        # json.loads also takes UTF-16/32, whose code units can hold a quote's byte
        # (U+5C22) and would turn a byte scanner's string state over
        text = body.decode("utf-8")
        # counting brackets first bounds the scan to crafted bodies (the writers' have a few)
        if text.count("[") + text.count("{") > MAX_META_DEPTH and \
                _nesting(text) > MAX_META_DEPTH:
            raise CaptureError(f"metadata is not JSON: nested too deeply "
                               f"(> {MAX_META_DEPTH})", offset, index)
        obj = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CaptureError(f"metadata is not JSON: {e}", offset, index) from None
    if not isinstance(obj, dict):
        raise CaptureError("metadata is not a JSON object", offset, index)
    return obj


class _Lifecycle:
    """Each connection opened once, used while open, closed once; at most
    MAX_OPEN_CONNECTIONS open at once."""

    def __init__(self) -> None:
        self.seen: dict[int, bool] = {}  # conn -> still open (a closed id is never reused)
        self.open = 0

    def check(self, kind: Kind, conn: int, offset: int, index: int) -> None:
        if kind is Kind.INFO:
            return
        if kind is Kind.OPEN:
            if conn in self.seen:
                raise CaptureError(f"connection {conn} opened twice", offset, index)
            if self.open >= MAX_OPEN_CONNECTIONS:
                raise CaptureError(f"more than {MAX_OPEN_CONNECTIONS} connections open at "
                                   f"once", offset, index)
            self.seen[conn] = True
            self.open += 1
        elif not self.seen.get(conn, False):
            raise CaptureError(f"{kind.name} on connection {conn}, which is not open",
                               offset, index)
        elif kind is Kind.CLOSE:
            self.seen[conn] = False
            self.open -= 1


def read_capture(path: str | os.PathLike, *, allow_truncated: bool = False
                 ) -> tuple[Header, list[Record]]:
    """The whole capture in memory (small captures, tests)."""
    r = CaptureReader(path, allow_truncated=allow_truncated)
    return r.header, r.records()
