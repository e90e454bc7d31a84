"""What the worker checks and books on each frame it sends (WorkerEndpoint's sending
side): rows in order, each REPLY booked on its slot for the COMPLETION's totals (built
from them, ``completion_of``), a COMPLETION only after every row (or aborted with a
Reason) and, built elsewhere, only with exactly those totals, a PROPOSAL only whole and
before any REPLY, and, when the worker checks its own rows (``check_outgoing``), the
verifier's row checks before a REPLY or PROPOSAL leaves."""

from __future__ import annotations

from pp1q.core.errors import LocalProtocolError, Reason, RemoteProtocolError
from pp1q.wire.endpoint import SlotTrack
from pp1q.wire.framing import chain_checksum
from pp1q.wire.limits import Limits
from pp1q.wire.messages import Completion, Form, Proposal, Reply, Status, Step
from pp1q.wire.sizes import proposal_fits
from pp1q.wire.validate import check_proposal, check_reply


def check_order(index: int, s: SlotTrack) -> None:
    if index != len(s.checksums) + 1 or index > s.step.depth:
        raise LocalProtocolError(Reason.OUT_OF_ORDER, f"reply {index} out of order")


def book_reply(s: SlotTrack, token: int, nbytes: int, payload_sum: int) -> None:
    """Book a REPLY frame on its slot: what the COMPLETION and the COMMIT will check."""
    s.drafts.append(token)
    s.reply_bytes += nbytes
    s.checksums.append(payload_sum)


def book_proposal(s: SlotTrack, tokens: list, nbytes: int, row_checksums: list) -> None:
    """Book a PROPOSAL on its slot: every position at once (the COMMIT checks drafts)."""
    s.drafts = list(tokens)
    s.reply_bytes = nbytes
    s.checksums = list(row_checksums)


def check_own_proposal(p: Proposal, s: SlotTrack, limits: Limits, vocab: int,
                       full: bool) -> None:
    """Our PROPOSAL answers its step whole, before any REPLY, in one frame the verifier
    accepts; ``full``: the verifier's row checks too (``check_outgoing``)."""
    step = s.step
    if s.checksums:
        raise LocalProtocolError(Reason.OUT_OF_ORDER, "PROPOSAL after a REPLY")
    if not proposal_fits(step, limits):
        raise LocalProtocolError(Reason.FRAME_TOO_LARGE, "step answered row by row, not whole")
    if len(p.tokens) != step.depth:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"{len(p.tokens)} of {step.depth} rows")
    if max(p.entries) > step.top_k:
        raise LocalProtocolError(Reason.SUPPORT_TOO_LARGE, f"{max(p.entries)} entries")
    if full:
        try:
            check_proposal(p, step, vocab, LocalProtocolError)
        except RemoteProtocolError as e:  # pp1q.core.q's parsers speak for received rows
            raise LocalProtocolError(e.reason, e.detail) from None


def completion_of(session: int, slot: int, s: SlotTrack, status: Status,
                  reason: Reason | str) -> Completion:
    """The COMPLETION of slot ``slot``'s outstanding step: the totals its frames booked."""
    step = s.step
    if step is None:
        raise LocalProtocolError(Reason.STATE_NOT_ALLOWED, f"slot {slot} has no step")
    return Completion(
        session=session, slot=slot, generation=step.generation, round_id=step.round_id,
        first_position=step.first_position, context_version=step.context_version,
        rows=len(s.checksums), reply_bytes=s.reply_bytes,
        reply_checksum=chain_checksum(s.checksums), status=int(status), reason=str(reason))


def check_completion(c: Completion, s: SlotTrack) -> None:
    if c.status == Status.OK and len(s.checksums) != s.step.depth:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "OK completion before every row")
    if c.status == Status.ABORTED and c.reason not in Reason._value2member_map_:
        raise LocalProtocolError(Reason.MALFORMED_CONTROL, "abort needs a Reason")


def check_own_completion(c: Completion, s: SlotTrack) -> None:
    """A COMPLETION built elsewhere (``send``) must state exactly what we booked."""
    if c != completion_of(c.session, c.slot, s, Status(c.status), c.reason):
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "completion totals differ")
    check_completion(c, s)


def check_own_reply(reply: Reply, step: Step, limits: Limits, vocab: int) -> None:
    """Our reply must pass the verifier's checks: fail here, not on the peer."""
    if reply.entries > max(limits.max_support, limits.dense_len):
        raise LocalProtocolError(Reason.SUPPORT_TOO_LARGE, f"{reply.entries} entries")
    if reply.form == Form.DENSE and reply.entries != limits.dense_len:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"dense entries {reply.entries}")
    if reply.form == Form.SPARSE and reply.entries > limits.max_support:
        raise LocalProtocolError(Reason.SUPPORT_TOO_LARGE, f"{reply.entries} entries")
    try:
        check_reply(reply, step, vocab, LocalProtocolError)
    except RemoteProtocolError as e:  # pp1q.core.q's parsers speak for received rows
        raise LocalProtocolError(e.reason, e.detail) from None
