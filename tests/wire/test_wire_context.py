"""CONTEXT (wire v2 revision 2) and the revision in HELLO: one negative test per refusal.

A refused CONTEXT leaves the slot holding nothing (no half-applied prefix) and the
slot's next STEP is refused with the CONTEXT's own reason, which is how the verifier
learns it. Sizes are checked from the control part before the payload is buffered.
"""

from __future__ import annotations

import tracemalloc

import msgspec
import pytest
import wire_vectors
from forked import assert_alone, forked
from wire_helpers import (
    PREFIX,
    SESSION,
    config,
    context_frame,
    control_of,
    forge,
    pair,
    step,
    worker_frames,
)

from pp1q.core.errors import LocalProtocolError, Reason, RemoteProtocolError
from pp1q.core.prefix import digest_of
from pp1q.wire import (
    WIRE_REVISION,
    Commit,
    ContextReceived,
    ContextRefused,
    Hello,
    HelloAnswer,
    Limits,
    Reset,
    SessionRefused,
    SessionStarted,
    StepRefused,
    StepRequested,
    VerifierEndpoint,
    WireConfig,
    WorkerEndpoint,
    encode,
)
from pp1q.wire.framing import HEADER_BYTES
from pp1q.wire.messages import MsgType

LIM = wire_vectors.LIMITS  # vocab 16, 4 slots, max_context 64


def _refused_context(w: WorkerEndpoint, data: bytes, reason: Reason, slot: int = 1):
    """Feed a CONTEXT; it must be refused with ``reason``, and so must the next STEP."""
    [ev] = w.receive_data(data, 0.0)
    assert ev == ContextRefused(slot, ev.generation, reason, ev.detail)
    if slot < LIM.max_slots:
        assert w.slots[slot].prefix is None  # nothing half-applied
        [refused] = w.receive_data(encode(step(slot=slot, generation=5)), 0.0)
        assert refused == StepRefused(slot, 5, 1, reason, refused.detail)
    return ev


def _raw_context(slot=1, generation=2, start=0, count=None, tokens=(3, 1, 4), digest=None,
                 payload_len=None):
    """A CONTEXT frame with any control fields (checksums valid)."""
    payload = b"".join(int(t).to_bytes(4, "little", signed=True) for t in tokens)
    control = msgspec.msgpack.encode([SESSION, slot, generation, start,
                                      len(tokens) if count is None else count,
                                      digest_of(tokens) if digest is None else digest])
    return forge(MsgType.CONTEXT, control, payload, payload_len=payload_len)


# -- accepted ----------------------------------------------------------------------------


def test_a_context_opens_then_appends_and_the_step_digest_proves_it():
    v, w = pair(contexts=False)
    assert w.receive_data(v.send(context_frame(1, 2, PREFIX)), 0.0) == [
        ContextReceived(1, 2, 0, len(PREFIX))]
    whole = [*PREFIX, 7]
    assert w.receive_data(v.send(context_frame(1, 3, [7], start=len(PREFIX),
                                               digest=digest_of(whole))), 0.0) == [
        ContextReceived(1, 3, len(PREFIX), 1)]
    assert w.context(1) == whole
    st = step(slot=1, generation=3, last_committed=len(whole) - 1,
              prefix_digest=digest_of(whole))
    assert w.receive_data(v.send(st, now=0.0), 0.0) == [StepRequested(st)]


def test_the_frame_is_read_whole_and_one_byte_at_a_time_alike():
    _v, w1 = pair(contexts=False)
    _v, w2 = pair(contexts=False)
    data = encode(context_frame(2, 1, PREFIX))
    evs = w1.receive_data(data, 0.0)
    one = [e for i in range(len(data)) for e in w2.receive_data(data[i:i + 1], 0.0)]
    assert evs == one == [ContextReceived(2, 1, 0, len(PREFIX))]
    assert w1.context(2) == w2.context(2) == PREFIX


def test_reset_of_a_discarded_proposal_keeps_the_prefix_cancel_drops_it():
    v, w = pair()
    st = step(slot=0, depth=2)
    w.receive_data(v.send(st, now=0.0), 0.0)
    w.receive_data(v.send(Reset(session=SESSION, slot=0, generation=1,
                                reason=Reason.STEP_TIMEOUT)), 0.0)
    assert w.context(0) == PREFIX and w.slots[0].drafts == []  # drafts gone, prefix kept
    nxt = step(slot=0, generation=2)  # same last_committed and digest: no resend needed
    assert w.receive_data(v.send(nxt, now=0.0), 0.0) == [StepRequested(nxt)]
    v.receive_data(worker_frames(w, nxt), 0.0)
    w.receive_data(v.send(Reset(session=SESSION, slot=0, generation=2,
                                reason=Reason.CANCELLED)), 0.0)
    assert w.slots[0].prefix is None  # the request ended


def test_commit_appends_the_accepted_drafts_and_the_token():
    v, w = pair()
    st = step(slot=3, depth=3)
    w.receive_data(v.send(st, now=0.0), 0.0)
    [ready] = v.receive_data(worker_frames(w, st), 0.0)
    w.receive_data(v.send(Commit(session=SESSION, slot=3, generation=1, round_id=1,
                                 accepted=1, token=11, committed=st.last_committed + 2)), 0.0)
    assert w.context(3) == [*PREFIX, ready.draft_ids[0], 11]


# -- refused: one reason each ------------------------------------------------------------


def test_slot_out_of_range():
    _v, w = pair(contexts=False)
    _refused_context(w, _raw_context(slot=LIM.max_slots), Reason.SLOT_OUT_OF_RANGE,
                     slot=LIM.max_slots)


def test_token_id_at_or_above_vocab():
    _v, w = pair(contexts=False)
    _refused_context(w, _raw_context(tokens=(3, 16, 4)), Reason.ID_OUT_OF_RANGE)


def test_negative_token_id():
    _v, w = pair(contexts=False)
    _refused_context(w, _raw_context(tokens=(3, -1, 4)), Reason.ID_OUT_OF_RANGE)


def test_total_length_above_max_context():
    _v, w = pair(contexts=False)
    _refused_context(w, _raw_context(start=LIM.max_context - 2), Reason.CONTEXT_TOO_LONG)


def test_count_disagrees_with_the_payload():
    _v, w = pair(contexts=False)
    _refused_context(w, _raw_context(count=4), Reason.UNEXPECTED_SIZE)


def test_empty_context():
    _v, w = pair(contexts=False)
    _refused_context(w, _raw_context(tokens=()), Reason.UNEXPECTED_SIZE)


def test_digest_mismatch():
    _v, w = pair(contexts=False)
    _refused_context(w, _raw_context(digest=12345), Reason.CHECKSUM_MISMATCH)


def test_payload_checksum_mismatch():
    _v, w = pair(contexts=False)
    frame = bytearray(_raw_context())
    frame[-1] ^= 0x01
    _refused_context(w, bytes(frame), Reason.CHECKSUM_MISMATCH)


def test_append_to_a_prefix_the_worker_does_not_hold():
    _v, w = pair(contexts=False)
    _refused_context(w, _raw_context(start=5), Reason.BAD_POSITION)


def test_append_at_the_wrong_position():
    _v, w = pair()  # slot 1 holds PREFIX (10 tokens)
    _refused_context(w, _raw_context(start=len(PREFIX) - 1, digest=0), Reason.BAD_POSITION)


def test_context_of_a_dead_generation():
    v, w = pair()
    w.receive_data(v.send(Reset(session=SESSION, slot=1, generation=4,
                                reason=Reason.STEP_TIMEOUT)), 0.0)
    [ev] = w.receive_data(_raw_context(generation=3), 0.0)
    assert ev.reason is Reason.STALE_GENERATION and w.slots[1].prefix is None


def test_step_without_any_context():
    _v, w = pair(contexts=False)
    [refused] = w.receive_data(encode(step(slot=0)), 0.0)
    assert refused.reason is Reason.NO_CONTEXT


def test_step_whose_digest_differs():
    _v, w = pair()
    [refused] = w.receive_data(encode(step(slot=0, prefix_digest=1)), 0.0)
    assert refused.reason is Reason.CHECKSUM_MISMATCH


def test_step_whose_last_committed_differs():
    _v, w = pair()
    [refused] = w.receive_data(encode(step(slot=0, last_committed=8,
                                           prefix_digest=digest_of(PREFIX))), 0.0)
    assert refused.reason is Reason.BAD_POSITION


def test_context_under_an_outstanding_step_breaks_the_stream():
    v, w = pair()
    w.receive_data(v.send(step(slot=1), now=0.0), 0.0)
    with pytest.raises(RemoteProtocolError) as e:
        w.receive_data(_raw_context(generation=1), 0.0)
    assert e.value.reason is Reason.STATE_NOT_ALLOWED
    with pytest.raises(LocalProtocolError):  # and the verifier refuses to send one
        v.send(context_frame(1, 1, PREFIX))


@pytest.mark.parametrize("tokens,start,reason", [
    ([3, 16], 0, Reason.ID_OUT_OF_RANGE),
    ([], 0, Reason.UNEXPECTED_SIZE),
    ([1] * 60, 10, Reason.CONTEXT_TOO_LONG),
])
def test_the_verifier_never_sends_a_bad_context(tokens, start, reason):
    v, _w = pair(contexts=False)
    with pytest.raises(LocalProtocolError) as e:
        v.send(context_frame(1, 1, tokens, start=start, digest=0))
    assert e.value.reason is reason


@forked
def test_sizes_are_refused_before_the_payload_is_buffered():
    """A CONTEXT declaring 128 KiB (under the 256 KiB header cap) but too long for max_context:
    refused from its control part; its payload is skipped, never allocated (measured in a
    forked child, its only thread: tracemalloc counts every thread's allocations)."""
    lim = Limits.make(vocab=16, max_slots=4, max_support=4, dense_len=20,
                      max_context=1 << 16)
    cfg = WireConfig(identity=wire_vectors.IDENTITY, limits=lim, versions=(1, 2))
    v = VerifierEndpoint(cfg, session=SESSION)
    w = WorkerEndpoint(cfg)
    w.receive_data(v.hello(), 0.0)
    tokens = [1] * (1 << 15)
    frame = _raw_context(start=(1 << 16) - 10, tokens=tokens)
    chunks = [frame[i:i + 4096] for i in range(0, len(frame), 4096)]
    assert_alone()
    tracemalloc.start()
    try:
        evs = [e for c in chunks for e in w.receive_data(c, 0.0)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [e.reason for e in evs] == [Reason.CONTEXT_TOO_LONG]
    assert peak < 64 * 1024  # not the 128 KiB payload


# -- the revision ------------------------------------------------------------------------


def _revision_one_hello() -> bytes:
    """A HELLO exactly as revision 1 laid it out: no revision, Limits of 7 fields."""
    h = wire_vectors.messages()["hello"]
    limits = list(msgspec.structs.astuple(h.limits))[:7]
    control = msgspec.msgpack.encode([h.session, h.versions,
                                      list(msgspec.structs.astuple(h.identity)), limits])
    return forge(MsgType.HELLO, control)


def _revision_two_hello() -> bytes:
    """Revision 2 (no PROPOSAL) laid HELLO out as revision 3 does: it decodes, and its
    revision is refused by name, never served as if it could read a PROPOSAL."""
    return encode(msgspec.structs.replace(wire_vectors.messages()["hello"], revision=2))


@pytest.mark.parametrize("revision,hello", [(1, _revision_one_hello), (2, _revision_two_hello)])
def test_an_older_revisions_hello_is_refused_by_name(revision, hello):
    w = WorkerEndpoint(config())
    [ev] = w.receive_data(hello(), 0.0)
    assert ev == SessionRefused(Reason.BAD_REVISION, ev.detail, by_peer=False)
    assert f"revision {revision}" in ev.detail
    [refusal] = _decode(w.data_to_send())
    assert refusal.reason == Reason.BAD_REVISION


@pytest.mark.parametrize("revision", [1, 2])
def test_an_older_revisions_answer_is_refused_by_name(revision):
    v = VerifierEndpoint(config(), session=wire_vectors.SESSION)
    v.hello()
    old = msgspec.structs.replace(wire_vectors.messages()["hello_answer"], revision=revision)
    with pytest.raises(RemoteProtocolError) as e:
        v.receive_data(encode(old), 0.0)
    assert e.value.reason is Reason.BAD_REVISION


def test_both_ends_say_their_revision():
    v = VerifierEndpoint(config(), session=SESSION)
    hello = v.hello()
    [msg] = _decode(hello)
    assert isinstance(msg, Hello) and msg.revision == WIRE_REVISION
    w = WorkerEndpoint(config())
    [started] = w.receive_data(hello, 0.0)
    assert isinstance(started, SessionStarted)
    [answer] = _decode(w.data_to_send())
    assert isinstance(answer, HelloAnswer) and answer.revision == WIRE_REVISION
    assert answer.limits.max_context == LIM.max_context


def test_header_of_a_context_carries_its_payload():
    data = wire_vectors.build()["context"]
    assert data[5] == MsgType.CONTEXT
    assert len(data) == HEADER_BYTES + len(control_of(data)) + 4 * len(
        wire_vectors.CONTEXT_TOKENS)


def _decode(data: bytes):
    from pp1q.wire import FrameDecoder

    return FrameDecoder(LIM).feed(data)
