"""Explicit transition tables of both endpoints, keyed by (role, state, direction, type).

Two machines per endpoint, as in h11: the connection (handshake) and one per slot.
A (state, event) pair missing from a table is a protocol violation: raised as
``RemoteProtocolError(STATE_NOT_ALLOWED)`` for something received, and as
``LocalProtocolError(STATE_NOT_ALLOWED)`` for something we tried to send. Pseudo
events (FAIL, TIMEOUT, LOST) are local decisions that move a slot too.
"""

from __future__ import annotations

import enum

from pp1q.core.errors import LocalProtocolError, Reason, RemoteProtocolError
from pp1q.wire.messages import MsgType


class Role(enum.StrEnum):
    VERIFIER = "verifier"  # connects, says HELLO, sends STEP/COMMIT/RESET
    WORKER = "worker"  # answers, drafts: sends REPLY/COMPLETION


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
    STEPPING = "stepping"  # verifier: waiting for replies and completion
    DRAFTING = "drafting"  # worker: sending replies
    COMPLETED = "completed"  # worker: completion sent, waiting for COMMIT or RESET
    READY = "ready"  # verifier: proposal validated and handed out, COMMIT or RESET next
    FAILED = "failed"  # verifier: proposal discarded, RESET next


class Pseudo(enum.StrEnum):
    FAIL = "fail"  # a received row/completion/refusal failed the proposal
    TIMEOUT = "timeout"  # the STEP deadline passed
    LOST = "lost"  # the connection closed under the step


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
    **{(V, Conn.READY, S, t): Conn.READY for t in (T.STEP, T.COMMIT, T.RESET, T.REFUSAL)},
    **{(V, Conn.READY, R, t): Conn.READY for t in (T.REPLY, T.COMPLETION, T.REFUSAL)},
    **{(W, Conn.READY, R, t): Conn.READY for t in (T.STEP, T.COMMIT, T.RESET)},
    (W, Conn.READY, R, T.REFUSAL): Conn.CLOSED,  # the verifier gave up on this connection
    **{(W, Conn.READY, S, t): Conn.READY for t in (T.REPLY, T.COMPLETION, T.REFUSAL)},
}

I, ST, DR, CO, RD, FA = (SlotState.IDLE, SlotState.STEPPING, SlotState.DRAFTING,
                         SlotState.COMPLETED, SlotState.READY, SlotState.FAILED)
SLOT_TABLE: dict[tuple, SlotState] = {
    # verifier
    (V, I, S, T.STEP): ST,
    (V, I, S, T.RESET): I,
    (V, ST, R, T.REPLY): ST,
    (V, ST, R, T.COMPLETION): RD,
    (V, ST, R, T.REFUSAL): FA,
    (V, ST, Pseudo.FAIL): FA,
    (V, ST, Pseudo.TIMEOUT): FA,
    (V, ST, Pseudo.LOST): FA,
    (V, ST, S, T.RESET): I,
    (V, RD, S, T.COMMIT): I,
    (V, RD, S, T.RESET): I,
    (V, FA, S, T.RESET): I,
    # worker
    (W, I, R, T.STEP): DR,
    (W, I, R, T.RESET): I,
    (W, DR, S, T.REPLY): DR,
    (W, DR, S, T.COMPLETION): CO,
    (W, DR, R, T.RESET): I,
    (W, CO, R, T.COMMIT): I,
    (W, CO, R, T.RESET): I,
}


def conn_next(role: Role, state: Conn, d: Dir, t: MsgType) -> Conn:
    try:
        return CONN_TABLE[(role, state, d, t)]
    except KeyError:
        raise _refusal(d)(Reason.STATE_NOT_ALLOWED, f"{role} {state}: {d} {t.name}") from None


def slot_next(role: Role, state: SlotState, d: Dir | Pseudo, t: MsgType | None = None):
    key = (role, state, d) if isinstance(d, Pseudo) else (role, state, d, t)
    try:
        return SLOT_TABLE[key]
    except KeyError:
        what = d if t is None else f"{d} {t.name}"
        raise _refusal(d)(Reason.STATE_NOT_ALLOWED, f"{role} slot {state}: {what}") from None


def _refusal(d) -> type:
    return RemoteProtocolError if d is Dir.RECV else LocalProtocolError
