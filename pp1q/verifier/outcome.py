"""What one scheduling step decides (shared by every decision path; re-exported by rounds),
and why a proposal gave nothing (``Fallback``, re-exported by link; ``classify``: the
cause a failed proposal counts under)."""

from __future__ import annotations

from dataclasses import dataclass

from pp1q.core.errors import Reason
from pp1q.core.outcomes import FallbackCause
from pp1q.wire.events import ProposalFailed


@dataclass(frozen=True)
class Outcome:
    accepted: int  # drafts accepted (0 for a target-only step)
    token: int  # correction, bonus or target-only token


@dataclass(frozen=True)
class Fallback:
    """Why a proposal produced nothing consumable."""

    cause: FallbackCause
    reason: Reason
    detail: str = ""


def classify(ev: ProposalFailed) -> FallbackCause:
    """The cause a failed proposal counts under: the worker's own word, our watchdog,
    the connection, or a fault we found in what it sent."""
    if ev.reason is Reason.STEP_TIMEOUT:
        return FallbackCause.WATCHDOG_TIMEOUT
    if ev.reason is Reason.CONNECTION_LOST:
        return FallbackCause.CONNECTION_LOST
    if ev.reason in (Reason.WORKER_ABORTED, Reason.PEER_REFUSED) or ev.by_peer:
        # a REFUSAL of the step, an ABORTED completion, or the session refused (slot -1)
        # with the step open: the worker's own word, not a fault we detected
        return FallbackCause.WORKER_REFUSED
    return FallbackCause.INVALID_REPLY
