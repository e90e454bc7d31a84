"""The worker's table of connections and sessions: what any peer may hold, bounded.

Sans-IO: the table decides, the asyncio adapter (pp1q.worker.connection) applies. A
connection is admitted with ``admit`` (its WorkerEndpoint and an opaque ``owner``, the
thing the adapter closes), opens a session when its HELLO passes (the endpoint calls
``open``), and leaves with ``release``. Bounds, and why each one keeps an honest
verifier in while idle strangers cost little:

- connections: at ``max_connections`` a new connection takes the place of the oldest one
  that has not said HELLO (which gets a REFUSAL ``too_many_connections``). Sessions are
  fewer than connections, so such a connection always exists: a flood of silent
  connections can never keep a verifier's connection out, only delay it by one HELLO.
- sessions: a session id names one live connection; a HELLO naming a live id is refused
  (``session_in_use``) and the first session is untouched (ids are the verifier's,
  drawn with ``secrets``). Sessions that have not sent a STEP yet are *pending*: at most
  ``max_pending_sessions`` of them, a new HELLO evicting the oldest (REFUSAL
  ``evicted``), and each expires after ``idle_timeout_s`` of silence (the endpoint's
  deadline). So idle HELLOs cannot fill the table: only sessions that stepped hold a
  place for good, up to ``max_sessions``; past that a HELLO is refused
  (``too_many_sessions``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.wire.table import Conn

DEFAULT_MAX_CONNECTIONS = 128  # sessions plus room for HELLOs in flight; each costs ~70 KiB
DEFAULT_MAX_SESSIONS = 64  # verifier connections one worker serves (each one rank group)
DEFAULT_MAX_PENDING_SESSIONS = 8  # HELLO'd, no STEP yet: a verifier starting or reconnecting
DEFAULT_HELLO_TIMEOUT_S = 10.0  # a verifier says HELLO in its first round trip
DEFAULT_IDLE_TIMEOUT_S = 300.0  # a verifier with no request yet reconnects this often

# why a connection ends without serving a session (pp1q_connections_closed_total{reason})
CLOSE_REASONS = (Reason.TOO_MANY_CONNECTIONS, Reason.HELLO_TIMEOUT, Reason.NO_HELLO,
                 Reason.IDLE_TIMEOUT, Reason.EVICTED)


@dataclass(frozen=True)
class PeerBounds:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_pending_sessions: int = DEFAULT_MAX_PENDING_SESSIONS
    hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 1 <= self.max_pending_sessions <= self.max_sessions < self.max_connections:
            raise ValueError("bounds need 1 <= max_pending_sessions <= max_sessions"
                             " < max_connections")
        if not (self.hello_timeout_s > 0 and self.idle_timeout_s > 0):
            raise ValueError("timeouts must be > 0")


class SessionTable:
    def __init__(self, bounds: PeerBounds | None = None) -> None:
        self.bounds = bounds or PeerBounds()
        self._owners: dict[object, object] = {}  # endpoint -> owner, oldest first
        self._sessions: dict[int, object] = {}  # session id -> endpoint, oldest first
        self._victims: list[tuple[object, Reason]] = []  # (owner, reason) to close

    @property
    def connections(self) -> int:
        return len(self._owners)

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    def owner_of(self, session: int):
        """The endpoint that holds ``session`` (None: no live session has that id)."""
        return self._sessions.get(session)

    def admit(self, endpoint, owner, now: float) -> list[tuple[object, Reason]]:
        """A new connection. Returns the (owner, reason) of connections to close for it
        (each one's endpoint already holds its REFUSAL: write it, then close)."""
        if len(self._owners) >= self.bounds.max_connections:
            oldest = next((ep for ep in self._owners if ep.state is Conn.IDLE), None)
            if oldest is None:  # cannot happen while sessions < connections; refuse anyway
                raise RemoteProtocolError(Reason.TOO_MANY_CONNECTIONS,
                                          f"{len(self._owners)} connections")
            self._evict(oldest, Reason.TOO_MANY_CONNECTIONS)
        self._owners[endpoint] = owner
        return self.take_victims()

    def open(self, endpoint, session: int) -> None:
        """``endpoint``'s HELLO names ``session``: admit it or raise (the endpoint refuses
        the HELLO with that reason). Connections evicted for it: ``take_victims()``."""
        if session in self._sessions:
            raise RemoteProtocolError(Reason.SESSION_IN_USE,
                                      f"session {session:016x} is live on another connection")
        pending = [ep for ep in self._sessions.values() if not ep.stepped]
        b = self.bounds
        if len(pending) >= b.max_pending_sessions or len(self._sessions) >= b.max_sessions:
            if not pending:
                raise RemoteProtocolError(Reason.TOO_MANY_SESSIONS,
                                          f"{len(self._sessions)} sessions, each stepping")
            self._evict(pending[0], Reason.EVICTED)
        self._sessions[session] = endpoint

    def release(self, endpoint) -> None:
        """The connection is gone: its session (if it owns one) goes with it."""
        self._owners.pop(endpoint, None)
        if endpoint.session is not None and self._sessions.get(endpoint.session) is endpoint:
            del self._sessions[endpoint.session]

    def owners(self) -> list:
        """Every admitted connection's owner, oldest first (a daemon closes them to stop)."""
        return list(self._owners.values())

    def take_victims(self) -> list[tuple[object, Reason]]:
        out, self._victims = self._victims, []
        return out

    def slots_held(self) -> int:
        """Slots with a live committed context (the worker's slots-in-use gauge)."""
        return sum(ep.contexts_held() for ep in self._sessions.values())

    def _evict(self, endpoint, reason: Reason) -> None:
        owner = self._owners.get(endpoint)
        endpoint.expire(reason)
        self.release(endpoint)
        if owner is not None:
            self._victims.append((owner, reason))
