"""Sans-IO endpoints wired together in memory: handshake, rounds, invalidation."""

import msgspec
import pytest
import wire_vectors
from wire_helpers import (
    PREFIX,
    SESSION,
    config,
    context_frame,
    pair,
    replies_for,
    rows_for,
    step,
    worker_frames,
)

from pp1q.core.prefix import digest_of
from pp1q.wire import (
    Commit,
    Committed,
    Conn,
    Discarded,
    LocalProtocolError,
    ProposalFailed,
    ProposalReady,
    Reason,
    RemoteProtocolError,
    Reset,
    SessionRefused,
    SessionStarted,
    SlotReset,
    SlotState,
    Status,
    StepRequested,
    VerifierEndpoint,
    WireConfig,
    WorkerEndpoint,
    encode,
)
from pp1q.wire.framing import read_header
from pp1q.wire.table import CONN_TABLE, SLOT_TABLE, Dir, Role, conn_next, slot_next
from pp1q.wire.table import Conn as C


def kinds(events):
    return [type(e).__name__ for e in events]


# -- handshake ---------------------------------------------------------------

def test_v2_only_when_both_sides_list_it():
    v, w = pair(versions=(1, 2))
    assert v.version == w.version == 2 and v.state is w.state is Conn.READY
    v, w = pair(versions=(1,), worker_versions=(2, 1))  # greedy verifier, sampled worker
    assert v.version == w.version == 1


@pytest.mark.parametrize("offered, ours", [((2,), (1,)), ((1, 2), (1,)), ((2,), ()),
                                           ((1,), ())])
def test_sampled_offered_to_a_side_that_did_not_enable_it_is_refused(offered, ours):
    # never a quiet downgrade to v1: a REFUSAL frame with its own reason, both sides told
    v = VerifierEndpoint(config(versions=offered), session=SESSION)
    w = WorkerEndpoint(config(versions=ours))
    wev, vev = _handshake(v, w)
    assert kinds(wev) == ["SessionRefused"] and not wev[0].by_peer
    assert wev[0].reason is Reason.SPECULATION_NOT_ENABLED
    assert w.version is None and w.state is Conn.CLOSED
    assert [(type(e), e.reason, e.by_peer) for e in vev if isinstance(e, SessionRefused)] == [
        (SessionRefused, Reason.SPECULATION_NOT_ENABLED, True)]


def test_versions_have_no_default_and_are_checked():
    with pytest.raises(TypeError):
        WireConfig(identity=wire_vectors.IDENTITY, limits=wire_vectors.LIMITS)
    assert config(versions=()).versions == ()  # speculation off: every HELLO refused
    with pytest.raises(LocalProtocolError) as e:
        config(versions=(3,))
    assert e.value.reason == Reason.BAD_VERSION


def _handshake(v, w):
    wev = w.receive_data(v.hello(), 0.0)
    return wev, v.receive_data(w.data_to_send(), 0.0)


def test_no_common_version_is_refused_on_both_sides():
    v = VerifierEndpoint(config((1,)), session=SESSION)  # greedy offered to a v2-only worker
    w = WorkerEndpoint(config((2,)))
    wev, vev = _handshake(v, w)
    assert wev == [SessionRefused(Reason.BAD_VERSION, wev[0].detail, by_peer=False)]
    assert vev[0].reason == Reason.BAD_VERSION and vev[0].by_peer
    assert v.state is w.state is Conn.CLOSED


def test_identity_mismatch_names_the_field():
    other = msgspec.structs.replace(wire_vectors.IDENTITY, draft_id="other-draft")
    v = VerifierEndpoint(config(), session=SESSION)
    w = WorkerEndpoint(config(identity=other))
    wev, vev = _handshake(v, w)
    assert vev[0] == SessionRefused(Reason.WRONG_IDENTITY, "mismatched draft_id", by_peer=True)
    assert kinds(wev) == ["SessionRefused"]
    # the worker's own event (its log line) carries both values; the wire, the names only
    mine = wire_vectors.IDENTITY.draft_id
    want = f"mismatched draft_id (draft_id: here 'other-draft', the peer's {mine!r})"
    assert wev[0].detail == want


def test_limits_negotiate_to_the_minimum():
    small = wire_vectors.LIMITS.meet(msgspec.structs.replace(
        wire_vectors.LIMITS, max_slots=2, max_support=2, sparse_row_bytes=16))
    v = VerifierEndpoint(config(), session=SESSION)
    w = WorkerEndpoint(config(limits=small))
    wev, vev = _handshake(v, w)
    assert isinstance(vev[0], SessionStarted) and vev[0].limits == small == v.limits
    assert len(v.slots) == 2 and w.decoder.limits == small


@pytest.mark.parametrize("change,reason", [
    (dict(session=SESSION + 1), Reason.WRONG_IDENTITY),
    (dict(version=3), Reason.BAD_VERSION),
    (dict(identity=msgspec.structs.replace(wire_vectors.IDENTITY, target_id="x")),
     Reason.WRONG_IDENTITY),
    (dict(limits=msgspec.structs.replace(wire_vectors.LIMITS, max_slots=5)),
     Reason.UNEXPECTED_SIZE),
])
def test_verifier_checks_the_answer(change, reason):
    v = VerifierEndpoint(config(), session=SESSION)
    v.hello()
    answer = msgspec.structs.replace(wire_vectors.messages()["hello_answer"], session=SESSION)
    with pytest.raises(RemoteProtocolError) as e:
        v.receive_data(encode(msgspec.structs.replace(answer, **change)), 0.0)
    assert e.value.reason == reason and v.state is Conn.ERROR


def test_nothing_but_hello_before_the_handshake():
    w = WorkerEndpoint(config())
    with pytest.raises(RemoteProtocolError) as e:
        w.receive_data(encode(step()), 0.0)
    assert e.value.reason == Reason.STATE_NOT_ALLOWED
    v = VerifierEndpoint(config(), session=SESSION)
    with pytest.raises(LocalProtocolError):
        v.send(step(), now=0.0)


# -- rounds ------------------------------------------------------------------

@pytest.mark.parametrize("top_k,temperature", [(0, 0.8), (3, 1.3), (0, 0.0)])
def test_round_trip_hands_out_exact_rows_only_after_completion(top_k, temperature):
    v, w = pair()
    st = step(slot=1, top_k=top_k, temperature=temperature)
    assert w.receive_data(v.send(st, now=0.0), 0.0) == [StepRequested(st)]
    frames = worker_frames(w, st)
    cut = len(frames) - 20  # everything but the tail of COMPLETION
    assert v.receive_data(frames[:cut], 0.1) == []  # rows alone are never consumable
    [ready] = v.receive_data(frames[cut:], 0.1)
    want = rows_for(st)
    assert isinstance(ready, ProposalReady) and ready.first_position == st.first_position
    assert ready.draft_ids == tuple(t for t, _, _ in want)
    if temperature:
        assert not ready.greedy and all(a == b for a, (_, b, _) in zip(ready.q_rows, want,
                                                                      strict=True))
    else:
        assert ready.greedy and ready.q_rows == ()
    commit = Commit(session=SESSION, slot=1, generation=1, round_id=1, accepted=2, token=4,
                    committed=st.last_committed + 3)
    assert w.receive_data(v.send(commit), 0.2) == [Committed(commit)]
    assert v.slots[1].state is w.slots[1].state is SlotState.IDLE
    # the worker appended the accepted drafts and the token from the COMMIT itself
    held = PREFIX + list(ready.draft_ids[:2]) + [4]
    assert w.context(1) == held
    nxt = step(slot=1, round_id=2, last_committed=st.last_committed + 3, top_k=top_k,
               temperature=temperature, prefix_digest=digest_of(held))
    assert w.receive_data(v.send(nxt, now=0.3), 0.3) == [StepRequested(nxt)]


def test_next_step_must_start_at_the_commit():
    v, w = pair()
    st = step()
    w.receive_data(v.send(st, now=0.0), 0.0)
    v.receive_data(worker_frames(w, st), 0.0)
    v.send(Commit(session=SESSION, slot=0, generation=1, round_id=1, accepted=0, token=1,
                  committed=st.last_committed + 1))
    with pytest.raises(LocalProtocolError) as e:
        v.send(step(round_id=2, last_committed=st.last_committed + 5), now=0.0)
    assert e.value.reason == Reason.BAD_POSITION


def test_two_slots_interleaved():
    v, w = pair()
    a, b = step(slot=0), step(slot=3, top_k=2, generation=4)
    w.receive_data(v.send(a, now=0.0) + v.send(b, now=0.0), 0.0)
    ra, rb = replies_for(a), replies_for(b, seed=1)
    data = b"".join(w.send(x) + w.send(y) for x, y in zip(ra, rb, strict=True))
    data += w.send(w.completion(3)) + w.send(w.completion(0))
    evs = v.receive_data(data, 0.0)
    assert [(e.slot, kinds([e])[0]) for e in evs] == [(3, "ProposalReady"), (0, "ProposalReady")]


def test_v1_session_is_greedy_only_and_never_downgrades():
    v, w = pair(versions=(1,), worker_versions=(1,))
    with pytest.raises(LocalProtocolError) as e:
        v.send(step(temperature=0.8), now=0.0)
    assert e.value.reason == Reason.SAMPLED_ON_V1
    # a sampled STEP that reaches a v1 worker anyway is refused, not answered greedily
    [ev] = w.receive_data(encode(step(temperature=0.8)), 0.0)
    assert ev.reason == Reason.SAMPLED_ON_V1 and w.slots[0].state is SlotState.IDLE
    assert b"sampled_on_v1" in w.data_to_send()
    st = step(temperature=0.0)
    w.receive_data(v.send(st, now=0.0), 0.0)
    [ready] = v.receive_data(worker_frames(w, st), 0.0)
    assert ready.greedy and len(ready.draft_ids) == st.depth


# -- invalidation --------------------------------------------------------------

def test_late_replies_after_reset_are_discarded_and_counted():
    v, w = pair()
    st = step(top_k=3)
    w.receive_data(v.send(st, now=0.0), 0.0)
    frames = worker_frames(w, st)
    reset = Reset(session=SESSION, slot=0, generation=1, reason=Reason.CANCELLED)
    assert w.receive_data(v.send(reset), 0.0) == [SlotReset(0, 1, Reason.CANCELLED, False)]
    evs = v.receive_data(frames, 0.1)
    assert all(isinstance(e, Discarded) and e.reason == Reason.STALE_GENERATION for e in evs)
    assert len(evs) == st.depth + 1 and v.discarded[Reason.STALE_GENERATION] == st.depth + 1
    with pytest.raises(LocalProtocolError) as e:  # the dead generation cannot step again
        v.send(step(round_id=2, top_k=3), now=0.2)
    assert e.value.reason == Reason.STALE_GENERATION
    # the next generation may step; a CANCELLED reset ended the request on the worker
    # (its prefix dropped), so the worker asks for the context before drafting again
    [refused] = w.receive_data(v.send(step(generation=2, top_k=3), now=0.2), 0.2)
    assert (refused.generation, refused.reason) == (2, Reason.NO_CONTEXT)


def test_worker_stops_sending_for_a_reset_step():
    v, w = pair()
    st = step()
    w.receive_data(v.send(st, now=0.0), 0.0)
    first, *rest = replies_for(st)
    w.send(first)
    [ev] = w.receive_data(v.send(Reset(session=SESSION, slot=0, generation=1,
                                       reason=Reason.STEP_TIMEOUT)), 0.0)
    assert ev.was_drafting and not w.is_live(0, 1, 1)
    with pytest.raises(LocalProtocolError) as e:
        w.send(rest[0])
    assert e.value.reason == Reason.STALE_GENERATION


def test_timeout_fails_the_proposal_then_late_frames_are_discarded():
    v, w = pair(step_timeout=0.5)
    st = step()
    w.receive_data(v.send(st, now=10.0), 10.0)
    assert v.next_deadline() == 10.5 and v.check_timeouts(10.4) == []
    [f] = v.check_timeouts(10.5)
    assert f == ProposalFailed(0, 1, 1, Reason.STEP_TIMEOUT, "deadline")
    assert v.slots[0].state is SlotState.FAILED and v.failures[Reason.STEP_TIMEOUT] == 1
    with pytest.raises(LocalProtocolError):  # a failed slot takes a RESET, nothing else
        v.send(step(generation=2), now=11.0)
    evs = v.receive_data(worker_frames(w, st), 11.0)
    assert {type(e) for e in evs} == {Discarded}
    v.send(Reset(session=SESSION, slot=0, generation=1, reason=Reason.STEP_TIMEOUT))
    v.send(step(generation=2), now=11.0)


def test_duplicate_completion_after_ready_is_discarded():
    v, w = pair()
    st = step()
    w.receive_data(v.send(st, now=0.0), 0.0)
    frames = worker_frames(w, st)
    v.receive_data(frames, 0.0)
    completion = encode(w.completion(0))
    [ev] = v.receive_data(completion, 0.0)
    assert isinstance(ev, Discarded) and ev.reason == Reason.DUPLICATE_ROUND


def test_connection_loss_fails_outstanding_steps_only():
    v, w = pair()
    a, b = step(slot=0), step(slot=1)
    w.receive_data(v.send(a, now=0.0) + v.send(b, now=0.0), 0.0)
    v.receive_data(worker_frames(w, a), 0.0)
    [f] = v.close()
    assert f.slot == 1 and f.reason == Reason.CONNECTION_LOST
    assert v.slots[0].state is SlotState.READY and v.state is Conn.CLOSED


def test_worker_abort_fails_the_proposal_with_its_cause():
    v, w = pair()
    st = step()
    w.receive_data(v.send(st, now=0.0), 0.0)
    data = w.send(replies_for(st)[0])
    data += w.send(w.completion(0, Status.ABORTED, Reason.ALLOCATION_INCONSISTENT))
    [f] = v.receive_data(data, 0.0)
    assert f.reason == Reason.WORKER_ABORTED and f.detail == "allocation_inconsistent"


# -- the tables ------------------------------------------------------------------

def test_transition_tables_refuse_every_pair_they_do_not_list():
    from pp1q.wire import MsgType
    from pp1q.wire.table import Pseudo
    from pp1q.wire.table import SlotState as S

    for role in Role:
        for state in C:
            for d in Dir:
                for t in MsgType:
                    key = (role, state, d, t)
                    if key in CONN_TABLE:
                        assert conn_next(role, state, d, t) == CONN_TABLE[key]
                        continue
                    err = RemoteProtocolError if d is Dir.RECV else LocalProtocolError
                    with pytest.raises(err):
                        conn_next(role, state, d, t)
        for state in S:
            for key in [(d, t) for d in Dir for t in MsgType] + [(p,) for p in Pseudo]:
                if (role, state, *key) in SLOT_TABLE:
                    continue
                with pytest.raises((RemoteProtocolError, LocalProtocolError)) as e:
                    slot_next(role, state, *key)
                assert e.value.reason == Reason.STATE_NOT_ALLOWED


def test_received_message_of_the_wrong_direction_breaks_the_stream():
    v, w = pair()
    with pytest.raises(RemoteProtocolError) as e:
        v.receive_data(encode(step()), 0.0)
    assert e.value.reason == Reason.STATE_NOT_ALLOWED and v.state is Conn.ERROR
    with pytest.raises(LocalProtocolError):
        v.receive_data(b"", 0.0)
    with pytest.raises(RemoteProtocolError):
        w.receive_data(encode(wire_vectors.messages()["reply_token_only"]), 0.0)


def test_a_new_generation_retires_older_ones_without_a_reset():
    v, w = pair()
    st = step()
    w.receive_data(v.send(st, now=0.0), 0.0)
    frames = worker_frames(w, st)
    v.receive_data(frames, 0.0)
    commit = Commit(session=SESSION, slot=0, generation=1, round_id=1, accepted=0, token=1,
                    committed=st.last_committed + 1)
    w.receive_data(v.send(commit), 0.0)
    # the slot's next request: its own context, then any last_committed
    prompt = [i % 16 for i in range(31)]
    w.receive_data(v.send(context_frame(0, generation=2, tokens=prompt)), 0.0)
    nxt = step(generation=2, last_committed=30, prefix_digest=digest_of(prompt))
    assert w.receive_data(v.send(nxt, now=0.0), 0.0) == [StepRequested(nxt)]
    replay = v.receive_data(_first_frame(frames), 0.0)  # a replayed frame of generation 1
    assert [(type(e), e.reason) for e in replay] == [(Discarded, Reason.STALE_GENERATION)]
    [refused] = w.receive_data(encode(step(round_id=2, last_committed=st.last_committed + 1)), 0.0)
    assert refused.reason == Reason.STALE_GENERATION


def _first_frame(data: bytes) -> bytes:
    return data[:read_header(data).frame_bytes]
