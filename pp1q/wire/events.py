"""Events the sans-IO endpoints return (received bytes and clocks in, events out)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pp1q.core.errors import Reason
from pp1q.core.q import DyadicRow
from pp1q.wire.limits import Limits
from pp1q.wire.messages import Commit, Identity, MsgType, Reply, Step


@dataclass(frozen=True, slots=True)
class SessionStarted:
    """HELLO answered: the session's version and negotiated limits are fixed."""

    session: int
    version: int
    limits: Limits
    peer: Identity


@dataclass(frozen=True, slots=True)
class SessionRefused:
    """The handshake failed; ``by_peer``: the peer refused (else we refused its HELLO)."""

    reason: Reason
    detail: str
    by_peer: bool


@dataclass(frozen=True, slots=True)
class ProposalReady:
    """Verifier: every byte of a step validated (its COMPLETION matched, or its one
    PROPOSAL passed every check). Consumable now.

    ``q_rows[i]`` is the exact q that sampled ``draft_ids[i]`` (empty for a greedy
    step; a dense row reads its FP32 payload in place, see validate.Rows);
    ``replies`` are the decoded REPLYs (for a PROPOSAL, a Reply a position viewing its
    payload): ``replies[i].q`` (FP32) and ``.ids`` (int32, sparse) are read-only
    zero-copy views, already validated.
    """

    slot: int
    generation: int
    round_id: int
    first_position: int
    draft_ids: tuple[int, ...]
    q_rows: Sequence[DyadicRow]
    replies: tuple[Reply, ...]
    greedy: bool
    # a sampled sparse step answered row by row (REPLYs, COMPLETION) although one
    # PROPOSAL fits it (``sizes.proposal_fits``): legal, but depth + 1 frames instead of
    # one for the verifier to check; a worker doing it always is worth an operator's look
    streamed_fitting: bool = False


@dataclass(frozen=True, slots=True)
class ProposalFailed:
    """Verifier: the whole unverified proposal is discarded (generation invalidated).

    The slot waits for a RESET; the request continues target-only from its prefix.
    """

    slot: int
    generation: int
    round_id: int
    reason: Reason
    detail: str = ""
    by_peer: bool = False  # the worker itself refused the STEP (a REFUSAL frame)


# Why a frame is dropped unread (Discarded.reason, pp1q_late_replies_discarded_total's
# labels): its generation was invalidated, or its round is done (a copy, or an old round)
DISCARD_REASONS = (Reason.STALE_GENERATION, Reason.DUPLICATE_ROUND)


@dataclass(frozen=True, slots=True)
class Discarded:
    """A frame for an invalidated generation (or an old round) dropped unread; ``reason``
    is one of DISCARD_REASONS."""

    slot: int
    generation: int
    round_id: int
    msg_type: MsgType
    reason: Reason
    nbytes: int


@dataclass(frozen=True, slots=True)
class StepRequested:
    """Worker: draft this step (one PROPOSAL where ``sizes.proposal_fits``, else REPLY
    1..depth, then COMPLETION)."""

    step: Step


@dataclass(frozen=True, slots=True)
class StepRefused:
    """Worker: a STEP was refused; a REFUSAL frame is queued in ``data_to_send()``."""

    slot: int
    generation: int
    round_id: int
    reason: Reason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ContextReceived:
    """Worker: a slot's committed context was opened (``start`` 0) or appended to."""

    slot: int
    generation: int
    start: int
    count: int

    @property
    def full(self) -> bool:
        """The whole prefix arrived: a drafter with a KV cache prefills it now."""
        return self.start == 0


@dataclass(frozen=True, slots=True)
class ContextRefused:
    """Worker: a CONTEXT was refused and the slot's context dropped; the next STEP of the
    slot is refused with this reason (the verifier learns it there)."""

    slot: int
    generation: int
    reason: Reason
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Committed:
    """Worker: the verifier committed a round; advance the drafter state."""

    commit: Commit


@dataclass(frozen=True, slots=True)
class SlotReset:
    """Worker: drop every speculative state of ``slot`` for generations <= ``generation``."""

    slot: int
    generation: int
    reason: Reason
    was_drafting: bool


Event = (SessionStarted | SessionRefused | ProposalReady | ProposalFailed | Discarded
         | StepRequested | StepRefused | Committed | SlotReset | ContextReceived
         | ContextRefused)
