"""The worker's sessions: one per live verifier connection, bounded.

Each session's committed contexts live in its ``WorkerEndpoint`` (pp1q.wire): CONTEXT
opens or appends, COMMIT appends, a RESET of a discarded proposal keeps them, the end of
the connection drops them. This table bounds how many sessions hold such state at once
and counts the slots that hold a context (the slots-in-use gauge).
"""

from __future__ import annotations

from pp1q.core.errors import Pp1qError, Reason

MAX_SESSIONS_TRACKED = 64  # verifier connections one worker serves; bounds this table


class StateRefusedError(Pp1qError):
    """The worker's state refuses an input (too many sessions...)."""


class WorkerState:
    def __init__(self) -> None:
        self._sessions: dict[int, object] = {}  # session id -> its WorkerEndpoint

    def open_session(self, session: int, endpoint) -> None:
        if len(self._sessions) >= MAX_SESSIONS_TRACKED:
            raise StateRefusedError(Reason.TOO_MANY_INFLIGHT, "too many verifier sessions")
        self._sessions[session] = endpoint

    def close_session(self, session: int) -> None:
        """A connection ended: every context under its session is gone with it."""
        self._sessions.pop(session, None)

    def slots_held(self) -> int:
        """Slots with a live committed context (the worker's slots-in-use gauge)."""
        return sum(ep.contexts_held() for ep in self._sessions.values())
