"""Framing refusals: one test per header/control reason, bounds before allocation."""

import msgspec
import numpy as np
import pytest
import wire_vectors
from wire_helpers import control_of, forge, payload_of

from pp1q.wire import (
    FrameDecoder,
    LocalProtocolError,
    MsgType,
    Reason,
    RemoteProtocolError,
    Reply,
    Step,
    encode,
)
from pp1q.wire.framing import FRAME_VERSION, HEADER_BYTES, MAGIC, PAYLOAD_SUM_AT
from pp1q.wire.limits import MAX_CONTROL_BYTES

V = wire_vectors.load()
LIM = wire_vectors.LIMITS


def refused(data: bytes, reason: Reason):
    d = FrameDecoder(LIM)
    with pytest.raises(RemoteProtocolError) as e:
        d.feed(data)
    assert e.value.reason == reason, e.value
    with pytest.raises(RemoteProtocolError):  # a failed stream stays failed
        d.feed(V["commit"])
    return e.value


def patched(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new):]


def test_bad_magic():
    refused(patched(V["step_dense"], 0, b"PP2Q"), Reason.BAD_MAGIC)


def test_bad_version():
    refused(patched(V["step_dense"], 4, b"\x01"), Reason.BAD_VERSION)


def test_unknown_message_type():
    refused(patched(V["step_dense"], 5, bytes([max(MsgType) + 1])), Reason.UNKNOWN_MESSAGE_TYPE)


def test_reserved_flags_must_be_zero():
    refused(patched(V["step_dense"], 6, b"\x01\x00"), Reason.BAD_FLAGS)


def test_empty_control_part():
    refused(forge(MsgType.STEP, b""), Reason.MALFORMED_CONTROL)


def test_control_part_over_its_cap():
    refused(forge(MsgType.HELLO, b"\x90", control_len=MAX_CONTROL_BYTES + 1),
            Reason.FRAME_TOO_LARGE)


def test_declared_payload_beyond_limits_is_refused_from_the_header_alone():
    # 2^31 declared: refused after the header bytes, before anything is allocated
    frame = forge(MsgType.REPLY, control_of(V["reply_dense"]), payload_len=1 << 31)
    e = refused(frame[:HEADER_BYTES], Reason.FRAME_TOO_LARGE)
    assert "2147483648" in e.detail


def test_payload_on_a_message_type_without_one():
    refused(forge(MsgType.COMMIT, control_of(V["commit"]), b"\x00" * 4), Reason.FRAME_TOO_LARGE)


def test_header_or_control_corruption_fails_the_head_checksum():
    data = V["step_dense"]
    refused(patched(data, 40, bytes([data[40] ^ 0x10])), Reason.CHECKSUM_MISMATCH)
    refused(patched(data, PAYLOAD_SUM_AT, b"\xff"), Reason.CHECKSUM_MISMATCH)


def test_payload_corruption_fails_the_payload_checksum():
    data = V["reply_dense"]
    e = refused(patched(data, len(data) - 5, b"\x7f"), Reason.CHECKSUM_MISMATCH)
    assert "payload" in e.detail


def test_payload_corruption_is_frame_aligned_for_the_endpoints():
    data = V["reply_sparse"]
    bad = patched(data, len(data) - 1, bytes([data[-1] ^ 1]))
    frames = FrameDecoder(LIM).feed_frames(bad + V["commit"])
    assert frames[0].error.reason == Reason.CHECKSUM_MISMATCH and frames[0].message.q is None
    assert frames[1].error is None and frames[1].message == wire_vectors.messages()["commit"]


def _step_fields():
    return list(msgspec.structs.astuple(wire_vectors.messages()["step_dense"]))


@pytest.mark.parametrize("fields", [
    _step_fields() + [0],  # an unknown extra field
    _step_fields()[:-1],  # a missing field
    [*_step_fields()[:1], 70000, *_step_fields()[2:]],  # slot beyond u16
    [*_step_fields()[:2], 1 << 24, *_step_fields()[3:]],  # generation beyond 24 bits
    [*_step_fields()[:8], "0.75", *_step_fields()[9:]],  # wrong type
    {"session": 1},  # a map, not an array
])
def test_malformed_step_control(fields):
    refused(forge(MsgType.STEP, msgspec.msgpack.encode(fields)), Reason.MALFORMED_CONTROL)


def test_garbage_control_bytes():
    refused(forge(MsgType.COMMIT, b"\xc1\xc1\xc1"), Reason.MALFORMED_CONTROL)


def test_reason_fields_accept_the_closed_enum_only():
    fields = list(msgspec.structs.astuple(wire_vectors.messages()["reset"]))
    fields[3] = "because"
    refused(forge(MsgType.RESET, msgspec.msgpack.encode(fields)), Reason.MALFORMED_CONTROL)


def _reply_head(name):
    return list(msgspec.structs.astuple(wire_vectors.messages()[name]))[:9]


def test_unknown_row_form():
    head = _reply_head("reply_token_only")
    head[7] = 3
    refused(forge(MsgType.REPLY, msgspec.msgpack.encode(head)), Reason.MALFORMED_CONTROL)


@pytest.mark.parametrize("name,entries,payload_len,reason", [
    ("reply_dense", LIM.dense_len - 1, None, Reason.UNEXPECTED_SIZE),  # dense != dense_len
    ("reply_sparse", 3, 20, Reason.UNEXPECTED_SIZE),  # payload != 8 * entries
    ("reply_sparse", LIM.max_support + 1, 8 * (LIM.max_support + 1), Reason.SUPPORT_TOO_LARGE),
    ("reply_sparse", 0, 0, Reason.MISSING_Q),
    ("reply_token_only", 2, 0, Reason.UNEXPECTED_SIZE),
])
def test_reply_sizes_checked_against_limits_before_allocation(name, entries, payload_len,
                                                              reason):
    head = _reply_head(name)
    head[8] = entries
    payload = payload_of(wire_vectors.build()[name])
    if payload_len is not None:
        payload = (payload * 8)[:payload_len]
    frame = forge(MsgType.REPLY, msgspec.msgpack.encode(head), payload)
    [f] = FrameDecoder(LIM).feed_frames(frame)
    assert f.error is not None and f.error.reason == reason and f.message.q is None
    refused(frame, reason)


def test_encode_refuses_values_outside_the_schema():
    bad = msgspec.structs.replace(wire_vectors.messages()["step_dense"], slot=70000)
    with pytest.raises(LocalProtocolError) as e:
        encode(bad)
    assert e.value.reason == Reason.MALFORMED_CONTROL
    with pytest.raises(LocalProtocolError) as e:
        encode("not a message")
    assert e.value.reason == Reason.UNKNOWN_MESSAGE_TYPE


def test_encode_refuses_a_reply_whose_arrays_disagree_with_its_head():
    r = wire_vectors.messages()["reply_sparse"]
    with pytest.raises(LocalProtocolError) as e:
        encode(msgspec.structs.replace(r, q=None))
    assert e.value.reason == Reason.MISSING_Q
    with pytest.raises(LocalProtocolError) as e:
        encode(msgspec.structs.replace(r, entries=r.entries + 1))
    assert e.value.reason == Reason.UNEXPECTED_SIZE
    with pytest.raises(LocalProtocolError):
        encode(msgspec.structs.replace(r, q=r.q.astype(np.float64)))


def test_one_header_and_payload_in_one_bytes_object():
    data = encode(wire_vectors.messages()["reply_dense"])
    assert isinstance(data, bytes) and len(data) == HEADER_BYTES + len(control_of(data)) + 4 * 20
    assert isinstance(FrameDecoder(LIM).feed(data)[0], Reply)
    assert isinstance(FrameDecoder(LIM).feed(V["step_dense"])[0], Step)


# -- the published header layout and reseal ----------------------------------------------

def test_read_header_reads_what_encode_wrote():
    from pp1q.wire import HEADER, read_header
    from pp1q.wire.framing import CONTROL_LEN_AT, HEAD_SUM_AT, PAYLOAD_LEN_AT, TYPE_AT

    data = V["reply_dense"]
    h = read_header(data)
    assert HEADER.size == HEADER_BYTES and h.magic == MAGIC and h.version == FRAME_VERSION
    assert h.mtype == data[TYPE_AT] == MsgType.REPLY and h.frame_bytes == len(data)
    assert h.control_len == int.from_bytes(data[CONTROL_LEN_AT:CONTROL_LEN_AT + 4], "little")
    assert h.payload_len == len(payload_of(data))
    assert PAYLOAD_LEN_AT == CONTROL_LEN_AT + 4 and HEAD_SUM_AT + 8 == HEADER_BYTES
    for name, frame in V.items():
        assert frame[:len(MAGIC)] == MAGIC, name


def test_reseal_makes_an_edited_frame_decode_again():
    from pp1q.wire.framing import reseal

    data = bytearray(V["reply_dense"])
    data[-1] ^= 0x01  # a payload bit: the payload checksum no longer matches
    [frame] = FrameDecoder(LIM).feed_frames(bytes(data))
    assert frame.error is not None and frame.error.reason == Reason.CHECKSUM_MISMATCH
    assert reseal(data) == len(data)
    [frame] = FrameDecoder(LIM).feed_frames(bytes(data))
    assert frame.error is None
