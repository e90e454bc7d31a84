"""Dense rows at scale: recycled payload buffers never overwrite a live view, dense
rows validate in place (in chunks) and become DyadicRows only on demand."""

import numpy as np
import pytest

from pp1q.core.errors import Reason, RowValidationError
from pp1q.core.q import MASS, build_row, parse_dense, validate_dense
from pp1q.wire import Form, FrameDecoder, Limits, PayloadPool, encode, reply_from_row
from pp1q.wire.pool import POOL_MIN_BYTES
from pp1q.wire.validate import Rows

V = 70000  # > two validation chunks, payload > the pool's 64 KiB floor
LIM = Limits.make(vocab=V, max_slots=2, max_depth=2, max_support=8, max_inflight=2)


def dense_frame(seed: int) -> tuple[bytes, object]:
    row = build_row(np.random.default_rng(seed).normal(size=V) * 2, temperature=0.9)
    tok = int(row.ids[0])
    r = reply_from_row(session=1, slot=0, generation=1, round_id=1, index=1, position=5,
                       token=tok, row=row, form=Form.DENSE)
    return encode(r), row


def test_pool_reuses_a_buffer_only_when_no_view_is_alive():
    (f1, r1), (f2, r2) = dense_frame(1), dense_frame(2)
    d = FrameDecoder(LIM)
    [a] = d.feed(f1)
    kept = a.q
    del a
    [b] = d.feed(f2)  # `kept` is alive: a second buffer, the first stays intact
    assert d.pool.allocations == 2 and not np.shares_memory(kept, b.q)
    assert parse_dense(kept, V) == r1 and parse_dense(b.q, V) == r2
    del kept
    [c] = d.feed(f1)  # the first buffer is free again: reused, no new allocation
    assert d.pool.allocations == 2 and parse_dense(c.q, V) == r1


def test_pool_never_retains_more_than_its_cap():
    d = FrameDecoder(LIM)
    d.pool.max_bytes = 4 * V  # room for one row
    frame, _ = dense_frame(3)
    live = [d.feed(frame)[0] for _ in range(3)]
    assert d.pool.retained == 4 * V and d.pool.allocations == 3 and len(live) == 3


def test_pool_keeps_nothing_for_sizes_it_cannot_retain():
    """Bounds before memory: payloads of ever new sizes past the cap (a hostile peer's
    PROPOSALs or CONTEXTs of many lengths) leave no bookkeeping behind."""
    pool = PayloadPool(max_bytes=POOL_MIN_BYTES)
    pool.take(POOL_MIN_BYTES)  # retained: the cap is reached
    for extra in range(1, 200):
        pool.take(POOL_MIN_BYTES + 8 * extra)
    assert pool.retained == POOL_MIN_BYTES and pool.allocations == 200
    assert list(pool._bufs) == [POOL_MIN_BYTES]


def test_dense_rows_are_parsed_lazily_and_exactly():
    frames = [dense_frame(s) for s in (4, 5)]
    replies = [FrameDecoder(LIM).feed(f)[0] for f, _ in frames]
    rows = Rows(replies, [None, None], V)
    assert len(rows) == 2 and rows._rows == [None, None]
    assert rows[1] == frames[1][1] and rows._rows[0] is None
    assert rows[:] == [frames[0][1], frames[1][1]]
    # iterating parses a row not parsed yet, as indexing does, and yields each in order
    lazy = Rows(replies, [None, None], V)
    assert list(lazy) == [frames[0][1], frames[1][1]] and None not in lazy._rows


def test_a_received_dense_row_reads_its_frame_in_place_and_keeps_it_alive():
    """The decision reads a received dense row's FP32 q where it arrived: the proposed
    token's count without extracting the support; the row's view keeps the pooled buffer
    from reuse; the support, extracted when read, equals the row that was sent."""
    f1, sent = dense_frame(6)
    d = FrameDecoder(LIM)
    [a] = d.feed(f1)
    row = Rows([a], [None], V)[0]
    assert np.shares_memory(row.dense_q(), a.q)
    assert row.count_of(a.token) == sent.count_of(a.token) > 0
    assert "ids" not in row.__dict__  # not extracted for it
    token = a.token
    del a
    d.feed(dense_frame(7)[0])  # the first buffer is still viewed by the row: a new one
    assert d.pool.allocations == 2
    assert row == sent and row.count_of(token + 1) == sent.count_of(token + 1)


def test_a_writeable_dense_array_is_extracted_at_once():
    """A caller's writeable array could change under the row: parse_dense copies out."""
    sent = dense_frame(8)[1]
    q = sent.to_dense()
    row = parse_dense(q, V)
    assert row.dense_q() is None
    q[:] = 0
    assert row == sent


@pytest.mark.parametrize("where", [10, 33000, V - 1])
def test_validate_dense_finds_a_fault_in_any_chunk(where):
    q = build_row(np.zeros(V)).to_dense()
    bad = q.copy()
    bad[where] += np.float32(2.0**-30)  # not a multiple of 2^-24
    with pytest.raises(RowValidationError) as e:
        validate_dense(bad, V)
    assert e.value.reason == Reason.NON_DYADIC
    moved = q.copy()
    moved[where] += np.float32(1 / MASS)  # dyadic, but the mass is off by one count
    with pytest.raises(RowValidationError) as e:
        validate_dense(moved, V)
    assert e.value.reason == Reason.WRONG_MASS
    assert validate_dense(q, V) is q or np.shares_memory(validate_dense(q, V), q)


def test_dense_reply_from_a_reused_zero_row_is_byte_identical():
    from pp1q.wire.pool import ZeroRow

    g = np.random.default_rng(60)
    scratch = ZeroRow()
    # top-7 rows in pairs between full-support ones: a full row is copied whole, a top-7
    # row after it is scattered after a memset, the next top-7 row after an indexed clear
    for n in range(12):
        logits = g.normal(size=300) * (1.0 if n % 3 else 40.0)
        row = build_row(logits, top_k=7 if n % 4 < 2 else None)
        token = int(row.ids[0])

        def frame(dense_row, row=row, token=token):
            return encode(reply_from_row(session=1, slot=0, generation=1, round_id=1,
                                         index=1, position=1, token=token, row=row,
                                         form=Form.DENSE, dense_len=320, dense_row=dense_row))

        assert frame(scratch) == frame(None)
