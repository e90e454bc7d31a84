"""Declared sizes, checked before a payload is buffered (bounds before memory).

The frame decoder (pp1q.wire.decoder) asks these with the header (``payload_cap``) and
then with the decoded control part (``reply_sizes``, ``proposal_sizes``,
``context_sizes``); an error they return is frame-aligned: the payload is skipped unread,
and only the proposal (REPLY, PROPOSAL) or the context (CONTEXT) it belongs to fails (a
REPLY form outside the set is raised instead: it breaks the stream).
``proposal_fits``: whether a step is answered by one PROPOSAL (both ends ask it alike).
"""

from __future__ import annotations

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.wire.limits import ENTRY_BYTES_DENSE, ENTRY_BYTES_SPARSE, ENTRY_BYTES_TOKEN, Limits
from pp1q.wire.messages import Form, MsgType

_FORMS = {int(f): f for f in Form}
# enum members as plain names (Python 3.11 takes ~0.1 us to look one up; this runs per frame)
_REPLY, _CONTEXT, _PROPOSAL = MsgType.REPLY, MsgType.CONTEXT, MsgType.PROPOSAL
_TOKEN_ONLY, _DENSE = Form.TOKEN_ONLY, Form.DENSE


def payload_cap(mtype: int, limits: Limits) -> int:
    """The largest payload a frame of this type may declare (checked from the header)."""
    if mtype == _REPLY:
        return limits.max_payload
    if mtype == _PROPOSAL:  # never more than one row's bound: no new memory to grant
        return min(limits.max_depth * limits.sparse_row_bytes, limits.max_payload)
    if mtype == _CONTEXT:
        return limits.max_context_bytes
    return 0


def proposal_fits(step, limits: Limits) -> bool:
    """Whether ``step`` is answered by one PROPOSAL: a sampled sparse step whose rows,
    each at most ``top_k`` entries, fit in one frame of at most a row's bound (the
    PROPOSAL payload cap). Any other step is answered row by row (REPLY ... COMPLETION)."""
    return (step.temperature > 0 and step.top_k > 0
            and step.depth * step.top_k * ENTRY_BYTES_SPARSE <= limits.max_payload)


def proposal_sizes(head, payload_len: int, limits: Limits) -> RemoteProtocolError | None:
    """A PROPOSAL's declared sizes, before its payload is buffered: one token, entry
    count and row checksum per position, 1..max_depth positions, each row 1..max_support
    entries, the payload exactly their rows. Frame-aligned: the proposal fails."""
    n = len(head.entries)
    if not len(head.tokens) == len(head.row_checksums) == n:
        return RemoteProtocolError(Reason.UNEXPECTED_SIZE, "proposal lists of unequal length")
    if not 0 < n <= limits.max_depth:
        return RemoteProtocolError(Reason.DEPTH_TOO_LARGE,
                                   f"{n} positions not in 1..{limits.max_depth}")
    if min(head.entries) == 0:
        return RemoteProtocolError(Reason.MISSING_Q, "sparse row with no entries")
    if max(head.entries) > limits.max_support:
        return RemoteProtocolError(Reason.SUPPORT_TOO_LARGE,
                                   f"{max(head.entries)} entries > {limits.max_support}")
    total = sum(head.entries)
    if payload_len != total * ENTRY_BYTES_SPARSE:
        return RemoteProtocolError(Reason.UNEXPECTED_SIZE,
                                   f"proposal payload {payload_len} for {total} entries")
    return None


def context_sizes(head, payload_len: int, limits: Limits) -> RemoteProtocolError | None:
    """A CONTEXT's declared sizes, before its payload is buffered: slot, count, total
    length. Frame-aligned: the payload is skipped unread and the context refused."""
    if head.slot >= limits.max_slots:
        return RemoteProtocolError(Reason.SLOT_OUT_OF_RANGE,
                                   f"context slot {head.slot} >= {limits.max_slots}")
    if head.count == 0 or payload_len != head.count * ENTRY_BYTES_TOKEN:
        return RemoteProtocolError(
            Reason.UNEXPECTED_SIZE, f"context payload {payload_len} for {head.count} tokens")
    if head.start + head.count > limits.max_context:
        return RemoteProtocolError(
            Reason.CONTEXT_TOO_LONG,
            f"context of {head.start + head.count} tokens > {limits.max_context}")
    return None


def reply_sizes(head, payload_len: int, limits: Limits) -> RemoteProtocolError | None:
    """A REPLY's declared sizes against its form and the limits, before its payload is
    buffered; an error here is frame-aligned (the payload is skipped, the proposal fails)."""
    form = _FORMS.get(head.form)  # a dict lookup: Form() per frame costs several of them
    if form is None:
        raise RemoteProtocolError(Reason.MALFORMED_CONTROL, f"form {head.form}")
    n, lim = head.entries, limits
    if form is _TOKEN_ONLY:
        expect = 0 if n == 0 else -1
    elif form is _DENSE:
        if n != lim.dense_len:
            return RemoteProtocolError(
                Reason.UNEXPECTED_SIZE, f"dense entries {n} != {lim.dense_len}"
            )
        expect = n * ENTRY_BYTES_DENSE
    else:
        if n == 0:
            return RemoteProtocolError(Reason.MISSING_Q, "sparse reply with no entries")
        if n > lim.max_support:
            return RemoteProtocolError(
                Reason.SUPPORT_TOO_LARGE, f"{n} entries > {lim.max_support}"
            )
        expect = n * ENTRY_BYTES_SPARSE
    if payload_len != expect:
        return RemoteProtocolError(
            Reason.UNEXPECTED_SIZE, f"{form.name} payload {payload_len} for {n} entries"
        )
    return None
