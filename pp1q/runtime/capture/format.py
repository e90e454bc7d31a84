"""The capture file format, version 2 (docs/capture.md): layouts, kinds and named limits.

    file header (32 bytes)
    0   8  magic          b"PP1QCAP\\0"
    8   2  version        FORMAT_VERSION
    10  1  role           Role: whose sockets were recorded
    11  1  flags          0 (reserved; any other value is refused)
    12  4  reserved       0
    16  8  start_unix_ns  wall clock when the capture began (informational)
    24  8  header_xxh3    xxh3_64 of bytes 0..23

    record (32-byte header, then ``length`` body bytes)
    0   1  kind           Kind
    1   1  direction      Direction (NONE for OPEN, CLOSE, INFO)
    2   2  flags          0
    4   4  conn           connection id (0 for INFO)
    8   8  time_ns        monotonic clock of the recording process
    16  4  length         body bytes (checked against the kind's cap before reading)
    20  4  reserved       0
    24  8  record_xxh3    xxh3_64 of bytes 0..23 followed by the body

All integers little-endian. A DATA body is bytes of one direction of a connection's
byte stream, in order: whole frames where the writer can, but a record may also hold
several frames or part of one (a receiver records what the socket gave it).
"""

from __future__ import annotations

import enum
import json
import struct

import xxhash

from pp1q.wire.framing import HEADER_BYTES
from pp1q.wire.limits import MAX_CONTROL_BYTES, MAX_PAYLOAD_CAP

MAGIC = b"PP1QCAP\0"
# 2: wire v2 revision 2 and later (one connection per session, CONTEXT frames; revision
# 3's PROPOSAL is a frame type, not a record kind). Version 1 files
# hold revision-1 sessions (a second "context" connection): refused, not half-read.
FORMAT_VERSION = 2
SUFFIX = ".pp1qcap"

FILE_HEADER = struct.Struct("<8sHBBIQ")  # bytes 0..23 of the file header; checksum follows
RECORD_HEADER = struct.Struct("<BBHIQII")  # bytes 0..23 of a record header; checksum follows
CHECKSUM = struct.Struct("<Q")
FILE_HEADER_BYTES = FILE_HEADER.size + CHECKSUM.size
RECORD_HEADER_BYTES = RECORD_HEADER.size + CHECKSUM.size

# -- limits, each with its reason --
MAX_DATA_BYTES = MAX_PAYLOAD_CAP + HEADER_BYTES + MAX_CONTROL_BYTES  # one largest frame whole
MAX_META_BYTES = 4096  # OPEN/CLOSE/INFO bodies are small JSON objects, never a data channel
# [ and { nested in an OPEN/CLOSE/INFO body: the writers nest 2 deep (draw_key); bounded
# before parsing, because json's own recursion limit differs by interpreter (about 1000
# levels on 3.11, 1500 on 3.12, 10000 on 3.13: a 4096-byte nest raised on one and not another)
MAX_META_DEPTH = 16
MAX_CONN_ID = 0xFFFFFFFF  # the conn field is a u32
MAX_PROTOCOL_CHARS = 32  # "wire": a short name, not a description
# connections open at once in one capture: 8x a worker's default max_connections (128);
# a reader holds two frame decoders and an endpoint for each (~200 KiB), so a crafted
# capture of OPEN records cannot make it hold gigabytes
MAX_OPEN_CONNECTIONS = 1024


class Role(enum.IntEnum):
    """Whose sockets were recorded: decides which direction is worker -> verifier."""

    VERIFIER = 1
    WORKER = 2


class Kind(enum.IntEnum):
    OPEN = 1  # a connection began; body: JSON {"protocol": ..., "peer": ...}
    DATA = 2  # stream bytes of one direction
    CLOSE = 3  # the connection ended; body: JSON {"reason": ...}
    INFO = 4  # facts about the recording process (settings); body: a JSON object


class Direction(enum.IntEnum):
    NONE = 0
    IN = 1  # received by the recording process
    OUT = 2  # sent by the recording process


class Protocol(enum.StrEnum):
    """What an OPEN connection carries (decides how replay decodes it)."""

    WIRE = "wire"  # wire v2 frames (pp1q.wire), revision 2 or later (this pp1q speaks 3)


_xxh3 = xxhash.xxh3_64_intdigest


def file_header(role: Role, start_unix_ns: int) -> bytes:
    head = FILE_HEADER.pack(MAGIC, FORMAT_VERSION, int(role), 0, 0, start_unix_ns)
    return head + CHECKSUM.pack(_xxh3(head))


def record_head(kind: Kind, direction: Direction, conn: int, time_ns: int, body) -> bytes:
    """The 32-byte header of a record carrying ``body`` (bytes-like)."""
    head = RECORD_HEADER.pack(int(kind), int(direction), 0, conn, time_ns, len(body), 0)
    h = xxhash.xxh3_64(head)
    h.update(body)
    return head + CHECKSUM.pack(h.intdigest())


def cap_for(kind: Kind) -> int:
    return MAX_DATA_BYTES if kind is Kind.DATA else MAX_META_BYTES


def meta_body(obj: dict) -> bytes:
    """Compact, key-sorted JSON (byte-stable for the same content)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def direction_for(kind: Kind) -> tuple[Direction, ...]:
    """Directions a record of ``kind`` may carry."""
    return (Direction.IN, Direction.OUT) if kind is Kind.DATA else (Direction.NONE,)
