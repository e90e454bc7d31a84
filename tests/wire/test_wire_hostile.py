"""A hostile peer against the worker's sans-IO side (issue 16): frames refused at their
header before anything is buffered, state only for negotiated slots, HELLO and idle
deadlines from a clock passed in, and a session table that bounds connections and
sessions, binds each session id to its connection and keeps idle strangers from
locking out an honest verifier."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from wire_helpers import SESSION, config, context_frame, forge, pair, step
from wire_vectors import LIMITS

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.wire import VerifierEndpoint, WorkerEndpoint
from pp1q.wire.events import ContextRefused, SessionRefused, SessionStarted, StepRefused
from pp1q.wire.framing import HEADER_BYTES, encode
from pp1q.wire.messages import CONNECTION_SLOT, MsgType, Refusal
from pp1q.wire.sessions import PeerBounds, SessionTable

BOUNDS = PeerBounds(max_connections=4, max_sessions=3, max_pending_sessions=2,
                    hello_timeout_s=5.0, idle_timeout_s=30.0)


def _dense_reply_header() -> bytes:
    """The 32 header bytes of a REPLY declaring a full dense row (the issue's probe)."""
    return forge(MsgType.REPLY, b"\x91\x00", payload_len=LIMITS.dense_row_bytes)[:HEADER_BYTES]


def _refusal_of(data: bytes) -> Refusal:
    from pp1q.wire.decoder import FrameDecoder

    msg = FrameDecoder().feed(data)[-1]  # after a HELLO answer, if one went out first
    assert isinstance(msg, Refusal)
    return msg


@pytest.mark.parametrize("ready", [False, True])
def test_a_reply_header_is_refused_at_the_header(ready):
    """A worker never receives REPLY: before HELLO (the issue's 1,500 half-sent dense rows)
    and after it, the header alone is refused; no control part or payload is buffered."""
    if ready:
        _, w = pair()
    else:
        w = WorkerEndpoint(config())
    with pytest.raises(RemoteProtocolError) as e:
        w.receive_data(_dense_reply_header(), 0.0)
    assert e.value.reason is Reason.STATE_NOT_ALLOWED
    assert w.decoder.buffered <= HEADER_BYTES


def test_a_context_before_hello_is_refused_at_the_header():
    w = WorkerEndpoint(config())
    frame = encode(context_frame())
    with pytest.raises(RemoteProtocolError) as e:
        w.receive_data(frame[:HEADER_BYTES], 0.0)
    assert e.value.reason is Reason.STATE_NOT_ALLOWED


def test_a_context_past_the_negotiated_length_is_refused_at_the_header():
    _, w = pair()
    head = forge(MsgType.CONTEXT, b"\x91\x00",
                 payload_len=w.limits.max_context_bytes + 4)[:HEADER_BYTES]
    with pytest.raises(RemoteProtocolError) as e:
        w.receive_data(head, 0.0)
    assert e.value.reason is Reason.FRAME_TOO_LARGE


def test_slots_past_the_negotiated_ones_hold_no_state():
    v, w = pair()
    n = w.limits.max_slots
    assert len(w.slots) == n
    from pp1q.wire.messages import context_of

    bad = context_of(session=SESSION, slot=n + 300, generation=0, tokens=list(range(50)),
                     digest=0)
    events = w.receive_data(encode(bad), 0.0)
    assert [type(e) for e in events] == [ContextRefused]
    assert events[0].reason is Reason.SLOT_OUT_OF_RANGE
    st = msgspec.structs.replace(step(), slot=n)
    events = w.receive_data(encode(st), 0.0)
    assert [type(e) for e in events] == [StepRefused]
    assert events[0].reason is Reason.SLOT_OUT_OF_RANGE
    assert len(w.slots) == n and w.contexts_held() == n


def test_hello_then_a_bad_frame_keeps_its_real_reason():
    """HELLO and a corrupt frame in one read: the error names the frame's fault
    (bad_magic), not the HELLO's."""
    v = VerifierEndpoint(config(), session=SESSION, step_timeout=1.0)
    w = WorkerEndpoint(config())
    with pytest.raises(RemoteProtocolError) as e:
        w.receive_data(v.hello() + b"XXXX" + bytes(28), 0.0)
    assert e.value.reason is Reason.BAD_MAGIC


# -- deadlines (the clock is the caller's) -------------------------------------------


def test_no_hello_by_the_deadline_expires_the_connection():
    table = SessionTable(BOUNDS)
    w = WorkerEndpoint(config(), sessions=table, now=100.0)
    table.admit(w, "conn", 100.0)
    when, reason = w.deadline()
    assert when == 105.0 and reason is Reason.HELLO_TIMEOUT
    assert w.expired(104.9) is None
    assert w.expired(105.0) is Reason.HELLO_TIMEOUT
    w.expire(Reason.HELLO_TIMEOUT)
    refusal = _refusal_of(w.data_to_send())
    assert refusal.reason == Reason.HELLO_TIMEOUT and refusal.slot == CONNECTION_SLOT


def _hello(table: SessionTable, session: int, now: float = 0.0, owner=None):
    v = VerifierEndpoint(config(), session=session, step_timeout=1.0)
    w = WorkerEndpoint(config(), sessions=table, now=now)
    victims = table.admit(w, owner or f"conn-{session}", now)
    events = w.receive_data(v.hello(), now)
    return v, w, events, victims


def _ctx(session: int):
    return msgspec.structs.replace(context_frame(0), session=session)


def _step(session: int):
    return msgspec.structs.replace(step(slot=0), session=session)


def test_a_session_that_never_steps_expires_when_idle_and_one_that_did_never():
    table = SessionTable(BOUNDS)
    v, w, events, _ = _hello(table, 1, now=0.0)
    assert [type(e) for e in events] == [SessionStarted]
    assert w.deadline() == (30.0, Reason.IDLE_TIMEOUT)
    v.receive_data(w.data_to_send(), 0.0)
    w.receive_data(v.send(_ctx(1)), 10.0)  # a frame heard pushes the deadline
    assert w.expired(39.9) is None and w.expired(40.0) is Reason.IDLE_TIMEOUT
    v2, w2, _, _ = _hello(table, 2, now=0.0)
    v2.receive_data(w2.data_to_send(), 0.0)
    w2.receive_data(v2.send(_ctx(2)), 1.0)
    w2.receive_data(v2.send(_step(2), 1.0), 1.0)
    assert w2.deadline() is None and w2.expired(1e9) is None


# -- the session table ---------------------------------------------------------------


def test_a_live_session_id_cannot_be_taken_over():
    table = SessionTable(BOUNDS)
    _, first, _, _ = _hello(table, SESSION)
    _, second, events, _ = _hello(table, SESSION)
    assert [type(e) for e in events] == [SessionRefused]
    assert events[0].reason is Reason.SESSION_IN_USE and not events[0].by_peer
    assert _refusal_of(second.data_to_send()).reason == Reason.SESSION_IN_USE
    table.release(second)  # the refused connection closes: the first session stays
    assert table.owner_of(SESSION) is first
    assert first.state.value == "ready"


def test_idle_strangers_never_lock_out_a_new_hello():
    """The issue's 64 idle HELLO sessions: sessions that never sent a STEP live in a small
    pre-session budget; a new HELLO evicts the oldest of them, never the newcomer."""
    table = SessionTable(BOUNDS)
    strangers = [_hello(table, 1000 + i, now=float(i))[1] for i in range(2)]
    _, honest, events, _ = _hello(table, SESSION, now=5.0)
    assert [type(e) for e in events] == [SessionStarted]
    victims = table.take_victims()
    assert victims == [(f"conn-{1000}", Reason.EVICTED)]
    assert strangers[0].state.value == "closed"  # told with a REFUSAL
    assert _refusal_of(strangers[0].data_to_send()).reason == Reason.EVICTED
    assert strangers[1].state.value == "ready" and table.sessions == 2


def test_sessions_that_stepped_are_never_evicted_and_the_next_hello_is_refused():
    table = SessionTable(PeerBounds(max_connections=4, max_sessions=2, max_pending_sessions=1,
                                    hello_timeout_s=5.0, idle_timeout_s=30.0))
    for sid in (1, 2):
        v, w, _, _ = _hello(table, sid)
        v.receive_data(w.data_to_send(), 0.0)
        w.receive_data(v.send(_ctx(sid)), 0.0)
        w.receive_data(v.send(_step(sid), 0.0), 0.0)
    _, third, events, _ = _hello(table, 3)
    assert [type(e) for e in events] == [SessionRefused]
    assert events[0].reason is Reason.TOO_MANY_SESSIONS
    assert _refusal_of(third.data_to_send()).reason == Reason.TOO_MANY_SESSIONS
    assert table.take_victims() == []


def test_the_connection_cap_evicts_the_oldest_connection_without_hello():
    table = SessionTable(BOUNDS)
    ws = []
    for i in range(4):
        w = WorkerEndpoint(config(), sessions=table, now=float(i))
        assert table.admit(w, f"c{i}", float(i)) == []
        ws.append(w)
    w = WorkerEndpoint(config(), sessions=table, now=9.0)
    assert table.admit(w, "c4", 9.0) == [("c0", Reason.TOO_MANY_CONNECTIONS)]
    assert _refusal_of(ws[0].data_to_send()).reason == Reason.TOO_MANY_CONNECTIONS
    assert table.connections == 4


def test_bounds_must_leave_room_for_a_hello():
    with pytest.raises(ValueError):
        PeerBounds(max_connections=3, max_sessions=3, max_pending_sessions=1,
                   hello_timeout_s=1.0, idle_timeout_s=1.0)
    with pytest.raises(ValueError):
        PeerBounds(max_connections=4, max_sessions=3, max_pending_sessions=0,
                   hello_timeout_s=1.0, idle_timeout_s=1.0)


def test_a_released_connection_leaves_nothing_behind():
    table = SessionTable(BOUNDS)
    _, w, _, _ = _hello(table, 5)
    table.release(w)
    table.release(w)  # twice: harmless
    assert table.connections == 0 and table.owner_of(5) is None and table.slots_held() == 0
    np.testing.assert_equal(table.sessions, 0)
