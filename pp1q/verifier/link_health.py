"""What /healthz says of the worker link (pp1q.verifier.link): ``worker`` is "connected"
only while rounds can speculate; else "degraded" (a session, but no speculation) or
"disconnected", with the ``cause`` and a ``detail``."""

from __future__ import annotations

from pp1q.core.errors import Reason
from pp1q.verifier.breaker import State
from pp1q.verifier.circuit import Circuit

# consecutive failed proposals (refused, invalid, lost) before /healthz says degraded: a
# worker refusing every step costs no waiting, but speculation is not happening
DEGRADED_AFTER_FAILURES = 8


def _health(worker: str, cause: str | None, detail: str | None) -> dict:
    return {"worker": worker, "cause": cause, "detail": detail}


def link_health(ready: bool, refused: Reason | None, worker: str, circuit: Circuit) -> dict:
    """``ready``: a session is up; ``refused``: the worker's last refusal of a session;
    ``worker``: its address; ``circuit``: the breaker each STEP consults."""
    if not ready:
        if refused is not None:  # the last HELLO (or the session) was refused
            return _health("disconnected", "session_refused", refused.value)
        return _health("disconnected", "no_session", worker)
    if circuit.breaker.state is not State.CLOSED:
        return _health("degraded", "circuit_open", circuit.breaker.name)
    if circuit.failing >= DEGRADED_AFTER_FAILURES:
        return _health("degraded", "proposals_failing",
                       f"{circuit.failing} in a row, the last {circuit.last_failure}")
    return _health("connected", None, None)
