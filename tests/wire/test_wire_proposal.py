"""Wire v2 revision 3: PROPOSAL, a sparse step's whole proposal in one frame.

A proposal fed whole, a byte at a time, or through the BufferedProtocol hooks hands out
exactly what was sent (the tokens, the DyadicRows, per-position Reply objects). Every
refusal names its closed-set Reason: a frame-aligned one fails that proposal only
(ProposalFailed, counted) and the next frame on the connection is read as usual; a
stream-level one raises. A PROPOSAL declaring more than its cap is refused at its
header, before any buffer. The worker's side: test_worker_send_proposal.py.
"""

from __future__ import annotations

import collections

import msgspec
import numpy as np
import pytest
from wire_helpers import (
    SESSION,
    assert_ready,
    config,
    control_of,
    drafted,
    feed_buffered,
    forge,
    forge_proposal,
    pair,
    payload_of,
    proposal_for,
    replies_for,
    step,
    stepped,
    worker_frames,
    worker_proposal,
)
from wire_vectors import IDENTITY, LIMITS

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.core.q import build_row, sample
from pp1q.core.rng import proposal_u24
from pp1q.wire import (
    Commit,
    Conn,
    Discarded,
    Limits,
    MsgType,
    ProposalFailed,
    ProposalReady,
    Reset,
    SlotState,
    VerifierEndpoint,
    WorkerEndpoint,
    encode,
)
from pp1q.wire.framing import HEADER_BYTES, read_header
from pp1q.wire.limits import DEFAULT_VOCAB, MAX_DEPTH_CAP
from pp1q.wire.messages import REPLY_HEAD_FIELDS
from pp1q.wire.proposal import row_checksum
from pp1q.wire.sizes import payload_cap, proposal_fits

SPARSE = step(top_k=3, depth=3)  # 3 rows of <= 3 entries: 72 payload bytes, fits in 80
OTHER = step(slot=1, top_k=3, depth=3, seed=5)  # read after a bad proposal of slot 0
# the PROPOSAL cap: its rows' bound, never more than a REPLY's (no new memory granted)
CAP = min(LIMITS.max_depth * LIMITS.sparse_row_bytes, LIMITS.max_payload)


def _bytewise(v, data: bytes) -> list:
    events = []
    for i in range(len(data)):
        events += v.receive_data(data[i:i + 1], 0.0)
    return events


FEEDS = {  # every way received bytes reach the decoder
    "whole": lambda v, data: v.receive_data(data, 0.0),
    "bytewise": _bytewise,
    "buffered": lambda v, data: feed_buffered(v, data, 0.0),
    "buffered bytewise": lambda v, data: feed_buffered(v, data, 0.0, read=1),
}



# -- which steps a PROPOSAL answers -----------------------------------------------------


@pytest.mark.parametrize("depth,top_k,temperature,fits", [
    (1, 1, 0.8, True), (3, 3, 0.8, True), (5, 2, 0.8, True),  # 80 bytes: the cap exactly
    (2, 4, 1e-6, True), (3, 4, 0.8, False), (5, 3, 0.8, False),  # 96, 120 bytes
    (1, 0, 0.8, False), (1, 0, 0.0, False),  # dense, greedy: always row by row
])
def test_proposal_fits_a_sampled_sparse_step_within_a_rows_bound(depth, top_k, temperature,
                                                                  fits):
    assert proposal_fits(step(depth=depth, top_k=top_k, temperature=temperature), LIMITS) is fits


# -- round trips -------------------------------------------------------------------


@pytest.mark.parametrize("feed", sorted(FEEDS))
@pytest.mark.parametrize("depth,top_k", [(1, 1), (3, 3), (2, 4), (5, 2)])  # (5, 2): at the cap
def test_a_proposal_round_trips_exactly(feed, depth, top_k):
    st = step(depth=depth, top_k=top_k, seed=depth)
    assert proposal_fits(st, LIMITS)
    v, w = stepped(st)
    tokens, rows = drafted(st, seed=depth)
    data = w.send_proposal(st, tokens, rows)
    assert read_header(data).frame_bytes == len(data)  # one frame, no COMPLETION after it
    assert v.receive_data(b"", 0.0) == []
    [ready] = FEEDS[feed](v, data)
    assert_ready(ready, st, tokens, rows)
    assert v.slots[0].state is SlotState.READY and w.slots[0].state is SlotState.COMPLETED
    assert not v.failures and not v.discarded and v.decoder.buffered == 0


@pytest.mark.parametrize("top_k", [32, 256])  # the k=32 round, the seed's widest screen
def test_a_proposal_at_the_deployments_shape_round_trips(top_k):
    """Vocabulary 129280, depth 5, the default limits: the rows (1,280 or 10,240 bytes)
    fit one frame far below a dense row's bound, and arrive exactly, whole or split."""
    limits = Limits.make(vocab=DEFAULT_VOCAB)
    identity = msgspec.structs.replace(IDENTITY, vocab=DEFAULT_VOCAB)
    st = step(depth=5, top_k=top_k)
    assert proposal_fits(st, limits)
    rng = np.random.default_rng(top_k)
    rows = [build_row(rng.normal(size=DEFAULT_VOCAB), temperature=st.temperature, top_k=top_k)
            for _ in range(st.depth)]
    tokens = [sample(row, proposal_u24(st.seed, st.generation, st.round_id,
                                       st.first_position + i)) for i, row in enumerate(rows)]
    for feed in ("whole", "buffered bytewise"):
        v, w = pair(identity=identity, limits=limits)
        w.receive_data(v.send(st, now=0.0), 0.0)
        data = w.send_proposal(st, tokens, rows)
        assert len(data) - len(payload_of(data)) < 256 and len(payload_of(data)) == 40 * top_k
        [ready] = FEEDS[feed](v, data)
        assert_ready(ready, st, tokens, rows)


def test_nothing_is_handed_out_before_the_last_byte():
    v, w = stepped(SPARSE)
    data = worker_proposal(w, SPARSE)
    assert v.receive_data(data[:-1], 0.0) == []
    [ready] = v.receive_data(data[-1:], 0.0)
    assert_ready(ready, SPARSE, *drafted(SPARSE))


def test_a_proposal_hands_out_what_its_replies_would():
    """Consumers are unchanged: the same rows answered whole or row by row give the same
    tokens, rows and per-position replies."""
    out = []
    for answer in (worker_proposal, worker_frames):
        v, w = stepped(SPARSE)
        [ready] = v.receive_data(answer(w, SPARSE), 0.0)
        out.append((ready.draft_ids, list(ready.q_rows),
                    [(msgspec.structs.astuple(r)[:REPLY_HEAD_FIELDS], r.ids.tobytes(),
                      r.q.tobytes()) for r in ready.replies]))
    assert out[0] == out[1]


def test_a_fitting_step_answered_row_by_row_is_flagged_and_taken():
    """A sparse step one PROPOSAL fits, answered with REPLYs and a COMPLETION, is legal
    (taken, same rows) and flagged ``streamed_fitting`` (the verifier counts it,
    pp1q_proposals_streamed_total); its PROPOSAL, a step too large for one (3 rows of
    4 entries: 96 bytes over LIMITS' 80), a dense and a greedy step are not."""
    wide, dense, greedy = step(top_k=4), step(top_k=0), step(temperature=0.0)
    assert proposal_fits(SPARSE, LIMITS) and not proposal_fits(wide, LIMITS)
    flags = {}
    for name, st, answer in (("streamed", SPARSE, worker_frames),
                             ("proposal", SPARSE, worker_proposal), ("wide", wide, worker_frames),
                             ("dense", dense, worker_frames), ("greedy", greedy, worker_frames)):
        v, w = stepped(st)
        [ready] = v.receive_data(answer(w, st), 0.0)
        assert isinstance(ready, ProposalReady) and len(ready.draft_ids) == st.depth
        flags[name] = ready.streamed_fitting
    assert flags == {"streamed": True, "proposal": False, "wide": False, "dense": False,
                     "greedy": False}


# -- refusals by the verifier: frame-aligned ---------------------------------------------


def _rows_replaced(prop, i: int, ids, q, token=None) -> bytes:
    """``prop`` with row ``i`` (and its token) replaced, its sizes and row checksum right."""
    ids, q = np.asarray(ids, "<i4"), np.asarray(q, "<f4")
    all_ids, all_q, tokens = list(prop.ids), list(prop.q), list(prop.tokens)
    all_ids[i], all_q[i] = ids, q
    tokens[i] = tokens[i] if token is None else token
    sums = [row_checksum(a, b) for a, b in zip(all_ids, all_q, strict=True)]
    return encode(msgspec.structs.replace(
        prop, tokens=tokens, entries=[a.size for a in all_ids], ids=tuple(all_ids),
        q=tuple(all_q), row_checksums=sums))


def _token(prop, i: int, token: int) -> bytes:
    tokens = list(prop.tokens)
    tokens[i] = token
    return encode(msgspec.structs.replace(prop, tokens=tokens))


def _payload(prop) -> bytes:
    return payload_of(encode(prop))


def _flip_last(frame: bytes) -> bytes:
    return frame[:-1] + bytes([frame[-1] ^ 1])


def _row_byte_changed(prop) -> bytes:
    """A byte of row 2's q changed and the frame sealed again: its checksums hold, the
    row checksum does not."""
    payload = bytearray(_payload(prop))
    payload[8 * prop.entries[0] + 4 * prop.entries[1]] ^= 1
    return forge_proposal(prop, bytes(payload))


def _too_deep(prop) -> bytes:
    n = LIMITS.max_depth + 1
    row = np.array([2], "<i4").tobytes() + np.array([1.0], "<f4").tobytes()
    return forge_proposal(prop, row * n, tokens=[2] * n, entries=[1] * n,
                          row_checksums=[row_checksum(row[:4], row[4:])] * n)


def _of(st):
    """The honest proposal of another step under SPARSE's keys (slot, generation, round)."""
    return lambda _prop: encode(proposal_for(st))


FRAME_ALIGNED = [  # (name, the step outstanding, the frame sent for it, reason)
    # proposal_sizes: the decoder refuses these before the payload is buffered
    ("a token more than rows", SPARSE, lambda p: forge_proposal(p, tokens=[*p.tokens, 2]),
     Reason.UNEXPECTED_SIZE),
    ("a row checksum fewer", SPARSE,
     lambda p: forge_proposal(p, row_checksums=p.row_checksums[:-1]), Reason.UNEXPECTED_SIZE),
    ("no positions", SPARSE,
     lambda p: forge_proposal(p, b"", tokens=[], entries=[], row_checksums=[]),
     Reason.DEPTH_TOO_LARGE),
    ("more positions than max_depth", SPARSE, _too_deep, Reason.DEPTH_TOO_LARGE),
    ("a row of no entries", SPARSE,
     lambda p: forge_proposal(p, _payload(p)[8 * p.entries[0]:], entries=[0, *p.entries[1:]]),
     Reason.MISSING_Q),
    ("a row above max_support", SPARSE,
     lambda p: forge_proposal(p, bytes(8 * (LIMITS.max_support + 3)),
                              entries=[LIMITS.max_support + 1, 1, 1]),
     Reason.SUPPORT_TOO_LARGE),
    ("payload an entry short", SPARSE, lambda p: forge_proposal(p, _payload(p)[:-8]),
     Reason.UNEXPECTED_SIZE),
    ("payload an entry long", SPARSE, lambda p: forge_proposal(p, _payload(p) + bytes(8)),
     Reason.UNEXPECTED_SIZE),
    ("payload half an entry long", SPARSE, lambda p: forge_proposal(p, _payload(p) + bytes(4)),
     Reason.UNEXPECTED_SIZE),
    # checksums
    ("payload checksum", SPARSE, lambda p: _flip_last(encode(p)), Reason.CHECKSUM_MISMATCH),
    ("a row checksum declared wrong", SPARSE,
     lambda p: forge_proposal(p, row_checksums=[*p.row_checksums[:2], p.row_checksums[2] ^ 1]),
     Reason.CHECKSUM_MISMATCH),
    ("a row's bytes changed, the frame sealed again", SPARSE, _row_byte_changed,
     Reason.CHECKSUM_MISMATCH),
    # what a COMPLETION would have matched
    ("first_position", SPARSE, lambda p: forge_proposal(p, first_position=p.first_position + 1),
     Reason.BAD_POSITION),
    ("context_version", SPARSE, lambda p: forge_proposal(p, context_version=1),
     Reason.WRONG_IDENTITY),
    ("fewer positions than depth", SPARSE, _of(step(top_k=3, depth=2)), Reason.UNEXPECTED_SIZE),
    ("more positions than depth", SPARSE, _of(step(top_k=2, depth=4)), Reason.UNEXPECTED_SIZE),
    # every position as a sparse REPLY is checked
    ("entries above top_k", SPARSE,
     lambda p: _rows_replaced(p, 0, [1, 2, 3, 5], [0.25] * 4, token=2), Reason.SUPPORT_TOO_LARGE),
    ("token at vocab", SPARSE, lambda p: _token(p, 1, 16), Reason.ID_OUT_OF_RANGE),
    ("negative token", SPARSE, lambda p: _token(p, 1, -1), Reason.ID_OUT_OF_RANGE),
    ("q(token) = 0", SPARSE,
     lambda p: _token(p, 2, next(t for t in range(16) if t not in p.ids[2])),
     Reason.ZERO_Q_AT_TOKEN),
    ("duplicate id", SPARSE, lambda p: _rows_replaced(p, 1, [2, 2, 5], [0.25, 0.25, 0.5], 5),
     Reason.DUPLICATE_ID),
    ("unsorted support", SPARSE, lambda p: _rows_replaced(p, 1, [5, 2], [0.5, 0.5], 2),
     Reason.UNSORTED_SUPPORT),
    ("non-dyadic", SPARSE,
     lambda p: _rows_replaced(p, 2, [2, 5, 7], [0.5, 0.5 - 2**-24, 2**-25], 2),
     Reason.NON_DYADIC),
    ("wrong mass", SPARSE, lambda p: _rows_replaced(p, 0, [2, 5], [0.5, 0.25], 2),
     Reason.WRONG_MASS),
    # a PROPOSAL answers a sparse step, whole, before any REPLY of it
    ("for a dense step", step(top_k=0, depth=3), encode, Reason.UNEXPECTED_SIZE),
    ("for a greedy step", step(temperature=0.0, depth=3), encode, Reason.UNEXPECTED_SIZE),
    ("after a REPLY of the step", SPARSE,
     lambda p: encode(replies_for(SPARSE)[0]) + encode(p), Reason.OUT_OF_ORDER),
]


@pytest.mark.parametrize("feed", sorted(FEEDS))
@pytest.mark.parametrize("name,st,bad,reason", FRAME_ALIGNED, ids=[c[0] for c in FRAME_ALIGNED])
def test_a_bad_proposal_fails_alone_and_the_connection_reads_on(feed, name, st, bad, reason):
    v, w = stepped(st)
    w.receive_data(v.send(OTHER, now=0.0), 0.0)
    data = bad(proposal_for(SPARSE)) + worker_proposal(w, OTHER, seed=5)
    events = FEEDS[feed](v, data)
    assert [type(e) for e in events] == [ProposalFailed, ProposalReady], events
    failed, ready = events
    assert failed == ProposalFailed(0, st.generation, st.round_id, reason, failed.detail)
    assert v.failures == collections.Counter({reason: 1}) and not v.discarded
    assert v.slots[0].state is SlotState.FAILED and v.slots[0].is_dead(st.generation)
    assert_ready(ready, OTHER, *drafted(OTHER, seed=5))  # the next frame was read as sent
    # the failed slot takes a RESET, then a new generation is answered and handed out
    w.receive_data(v.send(Reset(session=SESSION, slot=0, generation=st.generation,
                                reason=Reason.STEP_TIMEOUT)), 0.0)
    again = step(generation=st.generation + 1, top_k=3, depth=3)
    w.receive_data(v.send(again, now=0.0), 0.0)
    [ready] = FEEDS[feed](v, worker_proposal(w, again))
    assert_ready(ready, again, *drafted(again))
    assert v.state is Conn.READY and v.failures == collections.Counter({reason: 1})


# -- refusals by the verifier: the stream breaks --------------------------------------

STREAM_LEVEL = [  # (name, the frame, reason): no proposal to fail, the stream is unusable
    ("another session", lambda p: forge_proposal(p, session=SESSION + 1), Reason.WRONG_IDENTITY),
    ("a slot past the negotiated ones",
     lambda p: forge_proposal(p, slot=LIMITS.max_slots), Reason.SLOT_OUT_OF_RANGE),
    ("a generation never stepped", lambda p: forge_proposal(p, generation=5),
     Reason.STATE_NOT_ALLOWED),
    ("a list past the hard depth cap",  # the schema bounds it before lengths are compared
     lambda p: forge_proposal(p, tokens=[2] * (MAX_DEPTH_CAP + 1)), Reason.MALFORMED_CONTROL),
    ("a control part of the wrong shape", lambda p: forge(MsgType.PROPOSAL, b"\x93\x01\x02\x03"),
     Reason.MALFORMED_CONTROL),
]


@pytest.mark.parametrize("name,bad,reason", STREAM_LEVEL, ids=[c[0] for c in STREAM_LEVEL])
def test_a_stream_level_fault_in_a_proposal_raises(name, bad, reason):
    v, _ = stepped(SPARSE)
    with pytest.raises(RemoteProtocolError) as e:
        v.receive_data(bad(proposal_for(SPARSE)), 0.0)
    assert e.value.reason is reason and v.state is Conn.ERROR


# -- late and replayed proposals ---------------------------------------------------------


@pytest.mark.parametrize("late_after", ["reset", "timeout"])
def test_a_late_proposal_is_discarded_as_stale(late_after):
    v, w = stepped(SPARSE)
    data = worker_proposal(w, SPARSE)  # left before the worker read the RESET
    if late_after == "reset":
        w.receive_data(v.send(Reset(session=SESSION, slot=0, generation=1,
                                    reason=Reason.CANCELLED)), 0.0)
    else:  # the watchdog failed the step first (counted as such, once)
        [failed] = v.check_timeouts(100.0)
        assert failed.reason is Reason.STEP_TIMEOUT
    events = v.receive_data(data, 0.0)
    assert events == [Discarded(0, 1, 1, MsgType.PROPOSAL, Reason.STALE_GENERATION, len(data))]
    assert v.discarded == collections.Counter({Reason.STALE_GENERATION: 1})
    assert set(v.failures) <= {Reason.STEP_TIMEOUT}


def test_a_replayed_proposal_is_discarded_as_a_duplicate_round():
    v, w = stepped(SPARSE)
    data = worker_proposal(w, SPARSE)
    [ready] = v.receive_data(data, 0.0)
    dup = Discarded(0, 1, 1, MsgType.PROPOSAL, Reason.DUPLICATE_ROUND, len(data))
    assert v.receive_data(data, 0.0) == [dup]  # handed out already: never twice
    commit = Commit(session=SESSION, slot=0, generation=1, round_id=1, accepted=1, token=4,
                    committed=SPARSE.last_committed + 2)
    w.receive_data(v.send(commit), 0.0)
    assert v.receive_data(data, 0.0) == [dup]  # after the COMMIT too
    # and a row-by-row answer of the same round is no more consumable than the replay
    late = v.receive_data(encode(replies_for(SPARSE)[0]), 0.0)
    assert [(type(e), e.reason) for e in late] == [(Discarded, Reason.DUPLICATE_ROUND)]
    assert v.discarded == collections.Counter({Reason.DUPLICATE_ROUND: 3}) and not v.failures
    assert w.context(0)[-2:] == [ready.draft_ids[0], 4]  # the worker appended the commit


# -- bounds before memory --------------------------------------------------------------


def _header(payload_len: int) -> bytes:
    control = control_of(encode(proposal_for(SPARSE)))
    return forge(MsgType.PROPOSAL, control, payload_len=payload_len)[:HEADER_BYTES]


@pytest.mark.parametrize("feed", ["whole", "bytewise", "buffered"])
@pytest.mark.parametrize("n", [CAP + 1, 1 << 31, (1 << 32) - 1])
def test_a_proposal_above_its_cap_is_refused_at_its_header(feed, n):
    """The cap is one row's bound (no new memory granted): a header declaring more is
    refused before its control part, let alone its payload, is buffered."""
    assert payload_cap(MsgType.PROPOSAL, LIMITS) == CAP == 80
    v, _ = stepped(SPARSE)
    allocated = v.decoder.pool.allocations
    with pytest.raises(RemoteProtocolError) as e:
        FEEDS[feed](v, _header(n))
    assert e.value.reason is Reason.FRAME_TOO_LARGE and str(n) in e.value.detail
    assert v.decoder.buffered <= HEADER_BYTES and v.decoder.pool.allocations == allocated
    assert v.state is Conn.ERROR


def test_a_proposal_at_its_cap_passes_its_header():
    v, _ = stepped(SPARSE)
    assert v.receive_data(_header(CAP), 0.0) == []  # its control part is awaited
    assert v.decoder.buffered == HEADER_BYTES and v.state is Conn.READY


def test_a_verifier_awaiting_its_hello_answer_refuses_a_proposal_at_its_header():
    v = VerifierEndpoint(config(), session=SESSION)
    v.hello()
    with pytest.raises(RemoteProtocolError) as e:
        v.receive_data(_header(CAP), 0.0)
    assert e.value.reason is Reason.STATE_NOT_ALLOWED and v.decoder.buffered == 0


@pytest.mark.parametrize("ready", [False, True])
def test_a_worker_refuses_a_proposal_at_its_header(ready):
    """A worker never receives PROPOSAL: before HELLO or after, the header alone is
    refused and nothing it declares is buffered."""
    w = pair()[1] if ready else WorkerEndpoint(config())
    with pytest.raises(RemoteProtocolError) as e:
        w.receive_data(_header(CAP), 0.0)
    assert e.value.reason is Reason.STATE_NOT_ALLOWED
    assert w.decoder.buffered <= HEADER_BYTES
