"""The committed context each worker slot drafts after (WorkerEndpoint's receiving side).

A CONTEXT opens a slot's prefix (start 0) or appends where the held one ends, its
digest proving the whole; a COMMIT appends the accepted drafts and its token (in
``WorkerEndpoint._on_commit`` itself: every round ends with one, so it pays no call); a
STEP is drafted only when its last_committed and prefix_digest prove both ends hold the
same prefix. A refused CONTEXT leaves nothing half-applied: the slot holds no context until
the verifier resends one, and the refusal's own reason answers the slot's next STEP.
"""

from __future__ import annotations

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.core.prefix import Prefix
from pp1q.wire.endpoint import SlotTrack
from pp1q.wire.events import ContextReceived, ContextRefused
from pp1q.wire.framing import Frame
from pp1q.wire.limits import Limits
from pp1q.wire.messages import Context, Step
from pp1q.wire.validate import check_context


def receive_context(frame: Frame, s: SlotTrack, limits: Limits,
                    vocab: int) -> ContextReceived | ContextRefused:
    """Apply the CONTEXT in ``frame`` (the slot table already allowed it) to slot ``s``:
    ContextReceived, or ContextRefused with the slot left holding no context."""
    ctx: Context = frame.message
    try:
        if frame.error is not None:
            raise frame.error
        if s.is_dead(ctx.generation) or ctx.generation < s.generation:
            raise RemoteProtocolError(Reason.STALE_GENERATION,
                                      f"context for generation {ctx.generation}")
        ids = check_context(ctx, limits, vocab)
        prefix = _context_base(ctx, s)
        prefix.extend(ids.tolist())
        if prefix.digest != ctx.digest:
            raise RemoteProtocolError(Reason.CHECKSUM_MISMATCH, "context digest")
    except RemoteProtocolError as e:  # a copy: the raised one's traceback holds this frame
        s.prefix = None  # nothing half-applied: the verifier resends
        s.context_error = RemoteProtocolError(e.reason, e.detail)
        return ContextRefused(ctx.slot, ctx.generation, e.reason, e.detail)
    s.prefix, s.context_error = prefix, None
    return ContextReceived(ctx.slot, ctx.generation, ctx.start, ctx.count)


def _context_base(ctx: Context, s: SlotTrack) -> Prefix:
    """What the CONTEXT's tokens extend: nothing (start 0), else a copy of the held
    prefix, which must end exactly where the CONTEXT starts."""
    if ctx.start == 0:
        return Prefix()
    held = 0 if s.prefix is None else len(s.prefix)
    if s.prefix is None or held != ctx.start:
        raise RemoteProtocolError(Reason.BAD_POSITION,
                                  f"context appends at {ctx.start}, {held} held")
    return s.prefix.copy()


def check_step_context(step: Step, s: SlotTrack) -> None:
    """Draft only after the committed prefix the verifier will verify against."""
    if s.prefix is None:
        if s.context_error is not None:  # the refused CONTEXT's own reason
            raise RemoteProtocolError(s.context_error.reason, s.context_error.detail)
        raise RemoteProtocolError(Reason.NO_CONTEXT, f"slot {step.slot} holds no context")
    if step.last_committed != s.prefix.last_position:
        raise RemoteProtocolError(Reason.BAD_POSITION, f"last_committed {step.last_committed}"
                                  f" != held {s.prefix.last_position}")
    if step.prefix_digest != s.prefix.digest:
        raise RemoteProtocolError(Reason.CHECKSUM_MISMATCH, "prefix digest differs")
