"""Explicit transition tables of both endpoints, keyed by (role, state, direction, type).

Two machines per endpoint, as in h11: the connection (handshake) and one per slot.
A (state, event) pair missing from a table is a protocol violation: raised as
``RemoteProtocolError(STATE_NOT_ALLOWED)`` for something received, and as
``LocalProtocolError(STATE_NOT_ALLOWED)`` for something we tried to send. Pseudo
events are local decisions that move a machine too: FAIL, TIMEOUT, LOST for a slot;
REFUSE, CLOSE, ERROR for a connection.

This module is the only place where a state changes (h11's rule): the endpoints call
``conn_event`` / ``slot_event`` (look the event up and apply it at once) or
``conn_transition`` / ``slot_transition`` (look it up now, apply it when the ``with``
body, which holds the event's other checks, finishes without raising). The refusals
that depend on the connection's state alone (``check_usable``, ``check_receiving``,
``require_ready``) live here too.
"""

from __future__ import annotations

import enum

from pp1q.core.errors import LocalProtocolError, Reason, RemoteProtocolError
from pp1q.wire.messages import MsgType


class Role(enum.StrEnum):
    VERIFIER = "verifier"  # connects, says HELLO, sends CONTEXT/STEP/COMMIT/RESET
    WORKER = "worker"  # answers, drafts: sends REPLY/COMPLETION, or PROPOSAL


class Dir(enum.StrEnum):
    SEND = "send"
    RECV = "recv"


class Conn(enum.StrEnum):
    IDLE = "idle"  # verifier: HELLO not sent yet; worker: waiting for HELLO
    HELLO_SENT = "hello_sent"
    READY = "ready"
    CLOSED = "closed"  # refused or closed; nothing more is sent or accepted
    ERROR = "error"  # a protocol error happened; the connection must be dropped


class SlotState(enum.StrEnum):
    IDLE = "idle"  # no step outstanding
    STEPPING = "stepping"  # verifier: waiting for replies and completion, or a proposal
    DRAFTING = "drafting"  # worker: sending replies (or drafting its proposal)
    COMPLETED = "completed"  # worker: completion or proposal sent, COMMIT or RESET next
    READY = "ready"  # verifier: proposal validated and handed out, COMMIT or RESET next
    FAILED = "failed"  # verifier: proposal discarded, RESET next


class Pseudo(enum.StrEnum):
    FAIL = "fail"  # a received row, completion or proposal failed the proposal
    TIMEOUT = "timeout"  # the STEP deadline passed
    LOST = "lost"  # the connection closed under the step
    REFUSE = "refuse"  # worker: we refused the peer's HELLO
    CLOSE = "close"  # the connection is gone (closed, or refused by the peer)
    ERROR = "error"  # a protocol violation broke the stream


V, W = Role.VERIFIER, Role.WORKER
S, R = Dir.SEND, Dir.RECV
T = MsgType

CONN_TABLE: dict[tuple, Conn] = {
    (V, Conn.IDLE, S, T.HELLO): Conn.HELLO_SENT,
    (V, Conn.HELLO_SENT, R, T.HELLO_ANSWER): Conn.READY,
    (V, Conn.HELLO_SENT, R, T.REFUSAL): Conn.CLOSED,
    (W, Conn.IDLE, R, T.HELLO): Conn.READY,  # or CLOSED when we refuse it
    (W, Conn.READY, S, T.HELLO_ANSWER): Conn.READY,
    (W, Conn.CLOSED, S, T.REFUSAL): Conn.CLOSED,
    **{(V, Conn.READY, S, t): Conn.READY
       for t in (T.CONTEXT, T.STEP, T.COMMIT, T.RESET, T.REFUSAL)},
    **{(V, Conn.READY, R, t): Conn.READY
       for t in (T.REPLY, T.COMPLETION, T.PROPOSAL, T.REFUSAL)},
    **{(W, Conn.READY, R, t): Conn.READY for t in (T.CONTEXT, T.STEP, T.COMMIT, T.RESET)},
    (W, Conn.READY, R, T.REFUSAL): Conn.CLOSED,  # the verifier gave up on this connection
    **{(W, Conn.READY, S, t): Conn.READY
       for t in (T.REPLY, T.COMPLETION, T.PROPOSAL, T.REFUSAL)},
    # pseudo events
    (W, Conn.IDLE, Pseudo.REFUSE): Conn.CLOSED,  # HELLO refused (the REFUSAL is sent next)
    # the worker's bounds close a connection (deadline, eviction; the REFUSAL is sent next)
    **{(W, c, Pseudo.CLOSE): Conn.CLOSED for c in (Conn.IDLE, Conn.READY)},
    **{(V, c, Pseudo.CLOSE): Conn.CLOSED for c in (Conn.IDLE, Conn.HELLO_SENT, Conn.READY,
                                                   Conn.CLOSED)},
    (V, Conn.ERROR, Pseudo.CLOSE): Conn.ERROR,  # a broken stream stays broken
    **{(r, c, Pseudo.ERROR): Conn.ERROR for r in (V, W) for c in Conn},
}

I, ST, DR, CO, RD, FA = (SlotState.IDLE, SlotState.STEPPING, SlotState.DRAFTING,
                         SlotState.COMPLETED, SlotState.READY, SlotState.FAILED)
SLOT_TABLE: dict[tuple, SlotState] = {
    # verifier
    (V, I, S, T.CONTEXT): I,  # committed tokens only: nothing speculative is outstanding
    (V, I, S, T.STEP): ST,
    (V, I, S, T.RESET): I,
    (V, ST, R, T.REPLY): ST,
    (V, ST, R, T.COMPLETION): RD,
    (V, ST, R, T.PROPOSAL): RD,  # a sparse step's rows and totals at once (before any REPLY)
    (V, ST, R, T.REFUSAL): FA,
    (V, ST, Pseudo.FAIL): FA,
    (V, ST, Pseudo.TIMEOUT): FA,
    (V, ST, Pseudo.LOST): FA,
    (V, ST, S, T.RESET): I,
    (V, RD, S, T.COMMIT): I,
    (V, RD, S, T.RESET): I,
    (V, FA, S, T.RESET): I,
    # worker
    (W, I, R, T.CONTEXT): I,
    (W, I, R, T.STEP): DR,
    (W, I, R, T.RESET): I,
    (W, DR, S, T.REPLY): DR,
    (W, DR, S, T.COMPLETION): CO,
    (W, DR, S, T.PROPOSAL): CO,
    (W, DR, R, T.RESET): I,
    (W, CO, R, T.COMMIT): I,
    (W, CO, R, T.RESET): I,
}


def conn_next(role: Role, state: Conn, d: Dir | Pseudo, t: MsgType | None = None) -> Conn:
    """The connection's next state (pure lookup); raises for a pair the table lacks."""
    key = (role, state, d) if isinstance(d, Pseudo) else (role, state, d, t)
    try:
        return CONN_TABLE[key]
    except KeyError:
        what = d if t is None else f"{d} {t.name}"
        raise _refusal(d)(Reason.STATE_NOT_ALLOWED, f"{role} {state}: {what}") from None


def _receivable() -> dict[tuple[Role, Conn], frozenset[MsgType]]:
    out: dict = {}
    for key in CONN_TABLE:
        if len(key) == 4 and key[2] is Dir.RECV:
            out.setdefault(key[:2], set()).add(key[3])
    return {k: frozenset(v) for k, v in out.items()}


RECEIVABLE = _receivable()  # (role, state) -> message types the peer may send now


def receivable(role: Role, state: Conn) -> frozenset[MsgType] | None:
    """What may arrive in ``state`` (the frame decoder refuses any other type at its
    header, before buffering it); None after close or error: those states refuse frames
    themselves (check_receiving, check_usable)."""
    if state in (Conn.CLOSED, Conn.ERROR):
        return None
    return RECEIVABLE.get((role, state), frozenset())


def slot_next(role: Role, state: SlotState, d: Dir | Pseudo, t: MsgType | None = None):
    key = (role, state, d) if isinstance(d, Pseudo) else (role, state, d, t)
    try:
        return SLOT_TABLE[key]
    except KeyError:
        what = d if t is None else f"{d} {t.name}"
        raise _refusal(d)(Reason.STATE_NOT_ALLOWED, f"{role} slot {state}: {what}") from None


# -- applying transitions (the only writes of a ``state``) ----------------------------


def conn_event(ep, d: Dir | Pseudo, t: MsgType | None = None) -> Conn:
    """Check the event against CONN_TABLE and move endpoint ``ep`` (its ``role``,
    ``state``) at once (assigned only when it changes: most received frames leave
    READY as it was, and assigning recomputes what the decoder accepts)."""
    old = ep.state
    new = conn_next(ep.role, old, d, t)
    if new is not old:
        ep.state = new
    return new


def slot_event(role: Role, track, d: Dir | Pseudo, t: MsgType | None = None) -> SlotState:
    """Check the event against SLOT_TABLE and move slot ``track`` at once."""
    track.state = new = slot_next(role, track.state, d, t)
    return new


class _Transition:
    """``with``: the event is checked on entry and applied when the body (the event's
    other checks) finishes without raising; if it raises, the state is unchanged."""

    __slots__ = ("obj", "new")

    def __init__(self, obj, new) -> None:
        self.obj, self.new = obj, new

    def __enter__(self):
        return self.new

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.obj.state = self.new


def conn_transition(ep, d: Dir, t: MsgType) -> _Transition:
    return _Transition(ep, conn_next(ep.role, ep.state, d, t))


def slot_transition(role: Role, track, d: Dir, t: MsgType) -> _Transition:
    return _Transition(track, slot_next(role, track.state, d, t))


# enum members as plain names for the checks made per frame (Python 3.11 takes ~0.1 us
# to look an enum member up)
_ERROR, _CLOSED = Conn.ERROR, Conn.CLOSED


def check_usable(ep) -> None:
    """Refuse to feed bytes to a broken endpoint (our fault: the connection must go)."""
    if ep.state is _ERROR:
        raise LocalProtocolError(Reason.STATE_NOT_ALLOWED, "endpoint is in state ERROR")


def check_receiving(ep) -> None:
    """Refuse a frame on a closed connection (the peer's fault to send more)."""
    if ep.state is _CLOSED:
        raise RemoteProtocolError(Reason.STATE_NOT_ALLOWED, "data after close")


def require_ready(ep) -> None:
    """Refuse to send anything but the handshake before READY or after close."""
    if ep.state is not Conn.READY:
        raise LocalProtocolError(Reason.STATE_NOT_ALLOWED, f"connection is {ep.state}")


def _refusal(d) -> type:
    return RemoteProtocolError if d is Dir.RECV else LocalProtocolError
