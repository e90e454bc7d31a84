"""Golden vectors: every message type and row form, byte-exact, in any chunking."""

import msgspec
import numpy as np
import pytest
import wire_vectors
from wire_helpers import feed_all, splits

from pp1q.wire import Context, FrameDecoder, Reply, encode
from pp1q.wire.messages import TYPE_OF

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


def _same(a, b):
    if isinstance(a, (Reply, Context)):
        fa, fb = msgspec.structs.astuple(a), msgspec.structs.astuple(b)
        return all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
                   for x, y in zip(fa, fb, strict=True))
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


def test_buffered_protocol_path_receives_payload_in_place():
    stream = b"".join(VECTORS[n] for n in NAMES) * 2
    rng = np.random.default_rng(3)
    d, pos, out = decoder(), 0, []
    while pos < len(stream):
        buf = d.get_buffer(-1)
        n = min(len(buf), int(rng.integers(1, 90)), len(stream) - pos)
        buf[:n] = stream[pos:pos + n]
        pos += n
        out += [f.message for f in d.buffer_updated(n)]
    assert b"".join(encode(m) for m in out) == stream


def test_decoded_rows_are_read_only_views_of_one_payload_buffer():
    [r] = decoder().feed(VECTORS["reply_sparse"])
    assert not r.q.flags.writeable and not r.ids.flags.writeable
    assert np.shares_memory(r.ids, r.q) or r.ids.base is r.q.base


def test_docs_show_every_vector_byte_for_byte():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "wire.md").read_text()
    for name, data in VECTORS.items():
        assert wire_vectors.hexdump(data) in doc, f"docs/wire.md is stale for {name}"
    commit = VECTORS["commit"]
    assert commit[:8].hex(" ") in doc and commit[24:32].hex(" ") in doc
