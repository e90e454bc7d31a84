"""Capture file format: round trip, and a clear refusal for every kind of damage."""

import dataclasses
import struct

import pytest

from pp1q.runtime.capture import (
    MAGIC,
    CaptureError,
    CaptureReader,
    CaptureWriter,
    Direction,
    Kind,
    Protocol,
    Role,
    read_capture,
    write_records,
)
from pp1q.runtime.capture.format import (
    FILE_HEADER_BYTES,
    FORMAT_VERSION,
    MAX_DATA_BYTES,
    MAX_META_DEPTH,
    RECORD_HEADER_BYTES,
    file_header,
    record_head,
)
from pp1q.wire import MAGIC as WIRE_MAGIC


def _small(path, **kw):
    with CaptureWriter(path, role=Role.WORKER, wall_ns=123, **kw) as w:
        w.info({"step_timeout_s": 2.0}, now=1.0)
        c = w.open_conn(Protocol.WIRE, "10.0.0.2:5000", now=1.0)
        w.record(Direction.IN, c, 1.25, WIRE_MAGIC + bytes(40))
        w.record("out", c, 1.5, memoryview(bytearray(b"abc")))
        w.close_conn(c, "peer closed", now=2.0)
    return path


def test_round_trip(tmp_path):
    h, recs = read_capture(_small(tmp_path / "a.pp1qcap"))
    assert (h.version, h.role, h.start_unix_ns) == (FORMAT_VERSION, Role.WORKER, 123)
    assert [r.kind for r in recs] == [Kind.INFO, Kind.OPEN, Kind.DATA, Kind.DATA, Kind.CLOSE]
    assert recs[0].meta == {"step_timeout_s": 2.0} and recs[0].conn == 0
    assert recs[1].meta == {"protocol": "wire", "peer": "10.0.0.2:5000"}
    assert (recs[2].direction, recs[2].time_ns, recs[2].body) == (Direction.IN, 1_250_000_000,
                                                                  WIRE_MAGIC + bytes(40))
    assert (recs[3].direction, recs[3].body) == (Direction.OUT, b"abc")
    assert recs[4].meta == {"reason": "peer closed"}
    assert recs[2].offset == recs[1].offset + RECORD_HEADER_BYTES + len(recs[1].body)


def test_default_clock_is_monotonic_ns(tmp_path):
    with CaptureWriter.open(tmp_path / "c", "verifier") as w:
        c = w.open_conn()
        w.record(Direction.OUT, c, None, b"x")
        w.record(Direction.OUT, c, None, b"y")
    _, recs = read_capture(tmp_path / "c")
    assert recs[1].time_ns <= recs[2].time_ns and recs[1].time_ns > 0


def test_write_records_reproduces_the_file(tmp_path):
    src = _small(tmp_path / "a")
    h, recs = read_capture(src)
    write_records(tmp_path / "b", h, recs)
    assert (tmp_path / "b").read_bytes() == src.read_bytes()


def test_large_data_is_split_into_records_under_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr("pp1q.runtime.capture.writer.MAX_DATA_BYTES", 10)
    with CaptureWriter(tmp_path / "s", role=Role.VERIFIER) as w:
        w.record(Direction.OUT, w.open_conn(), 0.0, bytes(range(25)))
    _, recs = read_capture(tmp_path / "s")
    data = [r.body for r in recs if r.kind is Kind.DATA]
    assert [len(d) for d in data] == [10, 10, 5] and b"".join(data) == bytes(range(25))


def test_misuse_is_refused(tmp_path):
    with CaptureWriter(tmp_path / "m", role=Role.VERIFIER) as w:
        with pytest.raises(ValueError, match="not open"):
            w.record(Direction.OUT, 7, 0.0, b"x")
        with pytest.raises(ValueError, match="direction"):
            w.record(Direction.NONE, w.open_conn(), 0.0, b"x")
        with pytest.raises(ValueError, match="INFO body"):
            w.info({"x": "y" * 5000})


def test_max_bytes_stops_cleanly(tmp_path):
    with CaptureWriter(tmp_path / "cap", role=Role.VERIFIER, max_bytes=400) as w:
        c = w.open_conn(now=0.0)
        for i in range(50):
            w.record(Direction.OUT, c, i / 10, bytes(20))
        assert w.stopped
    _, recs = read_capture(tmp_path / "cap")  # still a valid file
    assert recs[-1].meta == {"stopped": "max_bytes"}
    assert 0 < sum(r.kind is Kind.DATA for r in recs) < 50


def test_write_failure_stops_recording_without_raising(tmp_path):
    w = CaptureWriter(tmp_path / "f", role=Role.VERIFIER)
    c = w.open_conn(now=0.0)

    class Full:
        def write(self, *args):
            raise OSError(28, "No space left on device")

        flush = close = write

    w._file.close()
    w._file = Full()
    w.record(Direction.OUT, c, 0.0, b"x")  # logged, not raised: serving goes on
    assert w.stopped and isinstance(w.failed, OSError)
    w.record(Direction.OUT, c, 0.0, b"y")
    w.close()


# -- damage ----------------------------------------------------------------------


def _damaged(tmp_path, mutate):
    raw = bytearray(_small(tmp_path / "ok").read_bytes())
    mutate(raw)
    bad = tmp_path / "bad"
    bad.write_bytes(bytes(raw))
    return bad


def _data_offset(tmp_path):
    _, recs = read_capture(_small(tmp_path / "ok"))
    return recs[2].offset


@pytest.mark.parametrize("where", ["header", "record head", "record body", "checksum"])
def test_a_flipped_byte_anywhere_is_refused(tmp_path, where):
    off = _data_offset(tmp_path)
    at = {"header": 17, "record head": off + 9, "record body": off + RECORD_HEADER_BYTES + 5,
          "checksum": off + 26}[where]

    def flip(raw):
        raw[at] ^= 0x01
    with pytest.raises(CaptureError, match="checksum mismatch"):
        CaptureReader(_damaged(tmp_path, flip), allow_truncated=True).records()


def test_truncated_file_is_refused_unless_allowed(tmp_path):
    full = _small(tmp_path / "ok").read_bytes()
    _, recs = read_capture(tmp_path / "ok")
    for cut in (recs[3].offset + 5, recs[3].offset + RECORD_HEADER_BYTES + 1):
        (tmp_path / "t").write_bytes(full[:cut])
        with pytest.raises(CaptureError, match="truncated") as e:
            read_capture(tmp_path / "t")
        assert e.value.index == 3 and e.value.offset == recs[3].offset
        r = CaptureReader(tmp_path / "t", allow_truncated=True)
        assert len(r.records()) == 3 and "truncated" in str(r.truncated)


def _with_version(head: bytes, version: int) -> bytes:
    return head[:8] + version.to_bytes(2, "little") + head[10:]


def test_file_header_refusals(tmp_path):
    cases = {
        b"": "not a pp1q capture",
        b"GIF89a..": "not a pp1q capture",
        MAGIC + b"\x01\x00": "truncated file header",
        # version 1 files hold wire v2 revision-1 sessions (a context channel): refused
        _with_version(file_header(Role.VERIFIER, 0), 1): "version 1.*re-record",
        _with_version(file_header(Role.VERIFIER, 0), 3): "version 3",
    }
    for raw, msg in cases.items():
        (tmp_path / "h").write_bytes(raw)
        with pytest.raises(CaptureError, match=msg):
            CaptureReader(tmp_path / "h")


def _with_records(tmp_path, *records):
    raw = file_header(Role.VERIFIER, 0)
    for kind, d, conn, body in records:
        raw += record_head(kind, d, conn, 0, body) + body
    (tmp_path / "r").write_bytes(raw)
    return tmp_path / "r"


OPEN = (Kind.OPEN, Direction.NONE, 1, b'{"protocol":"wire"}')


@pytest.mark.parametrize("records, msg", [
    ([(Kind.DATA, Direction.OUT, 1, b"x")], "not open"),
    ([OPEN, OPEN], "opened twice"),
    ([OPEN, (Kind.CLOSE, Direction.NONE, 1, b"{}"), (Kind.DATA, Direction.IN, 1, b"x")],
     "not open"),
    ([OPEN, (Kind.DATA, Direction.NONE, 1, b"x")], "direction"),
    ([(Kind.OPEN, Direction.IN, 1, b"{}")], "direction"),
    ([(Kind.INFO, Direction.NONE, 3, b"{}")], "connection 3"),
    ([(Kind.INFO, Direction.NONE, 0, b"[1]")], "not a JSON object"),
    ([(Kind.INFO, Direction.NONE, 0, b"\xff")], "not JSON"),
])
def test_structural_refusals(tmp_path, records, msg):
    with pytest.raises(CaptureError, match=msg):
        read_capture(_with_records(tmp_path, *records))


def _nested(depth: int) -> bytes:
    """A JSON object ``depth`` levels deep: {"a":{"a":...1...}}."""
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize("body", [
    # json.loads raised RecursionError on 3.11 and 3.12, "Expecting value" on 3.13
    b"[" * 4000,
    _nested(MAX_META_DEPTH + 1),  # valid JSON, within every parser's limit: was read
], ids=["unterminated", "object"])
def test_metadata_nesting_is_bounded_on_every_interpreter(tmp_path, body):
    info = (Kind.INFO, Direction.NONE, 0, body)
    with pytest.raises(CaptureError, match=rf"nested too deeply \(> {MAX_META_DEPTH}\)"):
        read_capture(_with_records(tmp_path, info))


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le"])
def test_metadata_nesting_counts_what_json_parses(tmp_path, encoding):
    """json.loads takes UTF-16 and UTF-32 bytes too: one character whose code units hold
    the bytes of a quote and a backslash (U+5C22, U+225C) turned a byte scanner's string
    state over, so the nest after it went uncounted (read on 3.13; 3.11's RecursionError
    escaped the reader). A body is UTF-8 text, as the writers write it."""
    fake = "\u5c22" if encoding.endswith("le") else "\u225c"
    nest = 1000 if encoding.startswith("utf-16") else 480  # within MAX_META_BYTES
    body = (f'{{"a":"{fake}","b":' + "[" * nest + "]" * nest + "}").encode(encoding)
    assert len(body) <= 4096
    info = (Kind.INFO, Direction.NONE, 0, body)
    with pytest.raises(CaptureError, match="metadata is not JSON"):
        read_capture(_with_records(tmp_path, info))


def test_metadata_brackets_inside_strings_do_not_nest(tmp_path):
    """Only [ and { outside strings count; the object itself nests exactly to the limit."""
    peer = b'[{\\"' * 500  # brackets and escaped quotes inside a string
    body = b'{"peer":"' + peer + b'","deep":' + _nested(MAX_META_DEPTH - 1) + b"}"
    _, recs = read_capture(_with_records(tmp_path, (Kind.INFO, Direction.NONE, 0, body)))
    assert recs[0].meta["peer"] == '[{"' * 500 and len(body) <= 4096


def test_unknown_kind_and_oversized_length_are_refused_before_reading(tmp_path):
    raw = bytearray(file_header(Role.VERIFIER, 0))
    head = bytearray(record_head(Kind.INFO, Direction.NONE, 0, 0, b"{}"))
    raw_kind = raw + bytes([9]) + head[1:] + b"{}"
    (tmp_path / "k").write_bytes(bytes(raw_kind))
    with pytest.raises(CaptureError, match="unknown record kind 9"):
        read_capture(tmp_path / "k")
    # a DATA length beyond the cap: refused from the header alone (no 4 GiB read)
    big = struct.pack("<BBHIQII", Kind.DATA, Direction.OUT, 0, 1, 0, MAX_DATA_BYTES + 1, 0)
    open_rec = record_head(*OPEN[:3], 0, OPEN[3]) + OPEN[3]
    (tmp_path / "b").write_bytes(bytes(raw) + open_rec + big + bytes(8))
    with pytest.raises(CaptureError, match="> "):
        read_capture(tmp_path / "b")


def test_errors_name_the_record(tmp_path):
    off = _data_offset(tmp_path)

    def flip(raw):
        raw[off + RECORD_HEADER_BYTES] ^= 0xFF
    with pytest.raises(CaptureError) as e:
        read_capture(_damaged(tmp_path, flip))
    assert (e.value.index, e.value.offset) == (2, off)
    assert f"record 2 at byte {off}" in str(e.value)


def test_reader_is_lazy_and_records_are_frozen(tmp_path):
    r = CaptureReader(_small(tmp_path / "a"))
    first = next(iter(r))
    assert first.offset == FILE_HEADER_BYTES
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.conn = 2


def test_large_bodies_bypass_the_buffer_in_order(tmp_path):
    """Bodies >= LARGE_BODY_BYTES go out with one writev; the order must not change."""
    from pp1q.runtime.capture.writer import LARGE_BODY_BYTES
    big = bytes(range(256)) * (LARGE_BODY_BYTES // 256 + 3)
    bodies = [b"a", big, b"b", b"c", big[::-1], b"d"]
    with CaptureWriter(tmp_path / "l", role=Role.WORKER) as w:
        c = w.open_conn(now=0.0)
        for i, b in enumerate(bodies):
            w.record(Direction.OUT, c, i, memoryview(b))
    _, recs = read_capture(tmp_path / "l")
    assert [r.body for r in recs if r.kind is Kind.DATA] == bodies
