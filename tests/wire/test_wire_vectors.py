"""Golden vectors: every message type and row form, byte-exact, in any chunking."""

import msgspec
import numpy as np
import pytest
import wire_vectors
from wire_helpers import control_of, feed_all, splits

from pp1q.wire import Context, FrameDecoder, MsgType, Proposal, Reply, encode, read_header
from pp1q.wire.messages import TYPE_OF
from pp1q.wire.sizes import payload_cap, proposal_fits
from pp1q.wire.validate import check_proposal

VECTORS = wire_vectors.load()
NAMES = sorted(VECTORS)


def decoder():
    return FrameDecoder(wire_vectors.LIMITS)


def test_checked_in_vectors_are_what_the_generator_builds():
    assert wire_vectors.build() == VECTORS  # a mismatch is a wire change


def test_every_message_type_and_row_form_has_a_vector():
    msgs = wire_vectors.messages()
    assert {TYPE_OF[type(m)] for m in msgs.values()} == set(TYPE_OF.values())
    forms = {m.form for m in msgs.values() if isinstance(m, Reply)}
    assert forms == {0, 1, 2}


def _same_field(x, y) -> bool:
    if isinstance(x, tuple):  # a PROPOSAL's rows: one array per position
        return len(x) == len(y) and all(map(_same_field, x, y))
    if isinstance(x, np.ndarray):
        return x.dtype == y.dtype and np.array_equal(x, y)
    return x == y


def _same(a, b):
    if isinstance(a, (Reply, Context, Proposal)):
        fa, fb = msgspec.structs.astuple(a), msgspec.structs.astuple(b)
        return type(a) is type(b) and all(map(_same_field, fa, fb))
    return a == b


@pytest.mark.parametrize("name", NAMES)
def test_decode_then_reencode_is_byte_identical(name):
    data = VECTORS[name]
    [msg] = decoder().feed(data)
    assert _same(msg, wire_vectors.messages()[name])
    assert encode(msg) == data


@pytest.mark.parametrize("name", NAMES)
def test_byte_by_byte(name):
    data = VECTORS[name]
    d = decoder()
    out = feed_all(d, [data[i:i + 1] for i in range(len(data))])
    assert len(out) == 1 and encode(out[0]) == data and d.at_boundary


@pytest.mark.parametrize("name", NAMES)
def test_random_splits(name):
    data = VECTORS[name]
    rng = np.random.default_rng(len(data))
    for _ in range(20):
        out = feed_all(decoder(), splits(data, rng))
        assert [encode(m) for m in out] == [data]


@pytest.mark.parametrize("name", NAMES)
def test_trailing_bytes_stay_buffered_for_the_next_frame(name):
    data, nxt = VECTORS[name], VECTORS["commit"]
    for k in (1, 31, 32, 33, len(nxt) - 1):
        d = decoder()
        out = d.feed(data + nxt[:k])
        assert [encode(m) for m in out] == [data]
        assert d.buffered == k and not d.at_boundary
        assert [encode(m) for m in d.feed(nxt[k:])] == [nxt] and d.at_boundary


def test_whole_stream_of_all_vectors_in_random_splits():
    stream = b"".join(VECTORS[n] for n in NAMES)
    rng = np.random.default_rng(7)
    for _ in range(10):
        out = feed_all(decoder(), splits(stream, rng))
        assert b"".join(encode(m) for m in out) == stream


def _buffered_frames(d, data, rng):
    """``data`` through the BufferedProtocol hooks in random read sizes: every frame."""
    pos, out = 0, []
    while pos < len(data):
        buf = d.get_buffer(-1)
        n = min(len(buf), int(rng.integers(1, 90)), len(data) - pos)
        buf[:n] = data[pos:pos + n]
        pos += n
        out += d.buffer_updated(n)
    return out


def test_buffered_protocol_path_receives_payload_in_place():
    stream = b"".join(VECTORS[n] for n in NAMES) * 2
    frames = _buffered_frames(decoder(), stream, np.random.default_rng(3))
    assert b"".join(encode(f.message) for f in frames) == stream


WITH_PAYLOAD = [n for n in NAMES if read_header(VECTORS[n]).payload_len > 0]


@pytest.mark.parametrize("name", WITH_PAYLOAD)
def test_a_flipped_payload_byte_fails_its_frame_at_any_chunking(name):
    """The payload checksum catches one flipped payload byte wherever the reads cut the
    frame, fed or received through the BufferedProtocol hooks: that frame fails alone
    with checksum_mismatch and the stream goes on."""
    data = VECTORS[name]
    payload_at = len(data) - read_header(data).payload_len
    rng = np.random.default_rng(payload_at)
    for _ in range(10):
        bad = bytearray(data)
        bad[int(rng.integers(payload_at, len(data)))] ^= 0x10
        stream = bytes(bad) + data  # a good copy after it: the decoder carries on
        d = decoder()
        fed = [f for chunk in splits(stream, rng) for f in d.feed_frames(chunk)]
        for frames in (fed, _buffered_frames(decoder(), stream, rng)):
            assert len(frames) == 2
            assert frames[0].error is not None and frames[0].error.reason.value == (
                "checksum_mismatch")
            assert frames[1].error is None and encode(frames[1].message) == data


def test_decoded_rows_are_read_only_views_of_one_payload_buffer():
    [r] = decoder().feed(VECTORS["reply_sparse"])
    assert not r.q.flags.writeable and not r.ids.flags.writeable
    assert np.shares_memory(r.ids, r.q) or r.ids.base is r.q.base


def test_the_proposal_vector_answers_the_sparse_step_vector_whole():
    """What docs/wire.md says of it: the step is one our worker answers with one PROPOSAL
    (its payload exactly the cap), row 1 is the sparse REPLY's row, and each row checksum
    is the payload_xxh3 a REPLY carrying that row has."""
    msgs = wire_vectors.messages()
    step, data = msgs["step_sparse"], VECTORS["proposal"]
    assert proposal_fits(step, wire_vectors.LIMITS)
    h = read_header(data)
    assert h.mtype == MsgType.PROPOSAL
    assert h.payload_len == step.depth * step.top_k * 8 == payload_cap(MsgType.PROPOSAL,
                                                                       wire_vectors.LIMITS)
    [p] = decoder().feed(data)
    assert len(p.tokens) == step.depth and p.first_position == step.first_position
    assert p.row_checksums[0] == read_header(VECTORS["reply_sparse"]).payload_xxh3
    reply = msgs["reply_sparse"]
    assert (np.array_equal(p.ids[0], reply.ids) and np.array_equal(p.q[0], reply.q)
            and p.tokens[0] == reply.token)
    assert all(not a.flags.writeable for a in (*p.ids, *p.q))
    rows = check_proposal(p, step, wire_vectors.VOCAB)  # what the verifier accepts
    assert [(r.ids.tolist(), r.counts.tolist()) for r in rows] == [
        (r.ids.tolist(), r.counts.tolist()) for r in wire_vectors.PROPOSAL_ROWS]


def test_docs_show_every_vector_byte_for_byte():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "wire.md").read_text()
    for name, data in VECTORS.items():
        assert wire_vectors.hexdump(data) in doc, f"docs/wire.md is stale for {name}"
    commit = VECTORS["commit"]
    assert commit[:8].hex(" ") in doc and commit[24:32].hex(" ") in doc
    # the worked examples: reply_sparse's control part, the proposal's lists and checksum
    assert control_of(VECTORS["reply_sparse"]).hex(" ") in doc
    proposal = control_of(VECTORS["proposal"]).hex(" ")
    for field in ("95 02 05 05 0b 05", "95 02 02 02 02 02", "95 cf 93 cc 8c 71 f5 19 26 77"):
        assert field in proposal and field in doc
