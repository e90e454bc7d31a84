"""WorkerEndpoint: the sans-IO worker (drafter) side of one connection.

Answers HELLO, receives CONTEXT / STEP / COMMIT / RESET, sends REPLY per position and
one COMPLETION per step, or one PROPOSAL for a sparse step that fits one frame
(``sizes.proposal_fits``). It keeps each slot's committed context (CONTEXT opens or
appends, COMMIT appends the accepted drafts and the correction/bonus token) and drafts a
STEP only when the STEP's last_committed and prefix_digest prove both ends agree on it
(pp1q.wire.worker_context); what it checks and books per frame it sends, and the
COMPLETION's totals: pp1q.wire.worker_sends.
Answers and refusals the endpoint decides itself are queued: write ``data_to_send()``
after every ``receive_data()``.
"""

from __future__ import annotations

import operator
import sys

from pp1q.core.errors import LocalProtocolError, Reason, RemoteProtocolError
from pp1q.core.q import DyadicRow
from pp1q.wire.endpoint import Endpoint, SlotTrack, WireConfig
from pp1q.wire.events import (
    Committed,
    ContextRefused,
    SessionRefused,
    SessionStarted,
    SlotReset,
    StepRefused,
    StepRequested,
)
from pp1q.wire.framing import (
    Frame,
    encode,
    encode_fields,
    encode_fields_parts,
    encode_parts,
    payload_checksum_of,
)
from pp1q.wire.messages import (
    CONNECTION_SLOT,
    WIRE_REVISION,
    Commit,
    Completion,
    Context,
    Form,
    Hello,
    HelloAnswer,
    Message,
    MsgType,
    Proposal,
    Refusal,
    Reply,
    Reset,
    Status,
    Step,
    type_of,
)
from pp1q.wire.pool import PayloadPool, ZeroRow
from pp1q.wire.proposal import pack_rows, proposal_from_rows
from pp1q.wire.reply_rows import reply_from_row, require_own_token
from pp1q.wire.sessions import SessionTable
from pp1q.wire.table import (
    Conn,
    Dir,
    Pseudo,
    Role,
    SlotState,
    conn_event,
    require_ready,
    slot_event,
    slot_transition,
)
from pp1q.wire.validate import check_commit, check_step, identity_differences, negotiate
from pp1q.wire.worker_context import check_step_context, receive_context
from pp1q.wire.worker_sends import (
    book_proposal,
    book_reply,
    check_completion,
    check_order,
    check_own_completion,
    check_own_proposal,
    check_own_reply,
    completion_of,
)

_SPARSE = int(Form.SPARSE)  # a REPLY head's form field, as the int msgpack writes
_DENSE = int(Form.DENSE)
_NATIVE_LE = sys.byteorder == "little"  # numpy's native arrays are already the wire's LE


class WorkerEndpoint(Endpoint):
    role = Role.WORKER

    def __init__(self, config: WireConfig, *, check_outgoing: bool = True,
                 pool: PayloadPool | None = None, sessions: SessionTable | None = None,
                 now: float = 0.0) -> None:
        """``check_outgoing``: run the verifier's row checks on every REPLY and PROPOSAL
        we send (a bug here then fails locally, before the peer sees it). ``sessions``:
        the daemon's table (bounds and deadlines, pp1q.wire.sessions; None: unbounded, for
        tests and benchmarks); ``now``: when the connection was accepted."""
        super().__init__(config, pool)
        self.check_outgoing = check_outgoing
        self.sessions = sessions
        self.opened_at = self.last_heard = now
        self.stepped = False  # a STEP was accepted: the session is no longer pending

    # -- deadlines (the caller's clock) -------------------------------------

    def deadline(self) -> tuple[float, Reason] | None:
        """When this connection expires unless it speaks, and why: no HELLO yet, or a
        session that never sent a STEP and went silent. None: no deadline."""
        if self.sessions is None:
            return None
        b = self.sessions.bounds
        if self.state is Conn.IDLE:
            return self.opened_at + b.hello_timeout_s, Reason.HELLO_TIMEOUT
        if self.state is Conn.READY and not self.stepped:
            return self.last_heard + b.idle_timeout_s, Reason.IDLE_TIMEOUT
        return None

    def expired(self, now: float) -> Reason | None:
        due = self.deadline()
        return due[1] if due is not None and now >= due[0] else None

    def expire(self, reason: Reason) -> None:
        """Close the connection on our own bounds; the REFUSAL saying why is queued
        (write ``data_to_send()``, then close). A session id the peer has not sent yet is 0."""
        if self.state not in (Conn.IDLE, Conn.READY):
            return
        conn_event(self, Pseudo.CLOSE)
        self._outbox.append(encode(Refusal(
            session=self.session or 0, slot=CONNECTION_SLOT, generation=0, round_id=0,
            reason=reason, detail="closed by the worker's bounds on its peers")))

    # -- receiving ----------------------------------------------------------

    def _on_frame(self, frame: Frame, now: float, events: list) -> None:
        self.last_heard = now
        msg = frame.message
        t = type_of(msg)
        if self.state is Conn.IDLE and t is MsgType.HELLO:
            self._on_hello(msg, events)
            return
        conn_event(self, Dir.RECV, t)
        self._check_session(msg, RemoteProtocolError)
        if t is MsgType.CONTEXT:
            self._on_context(frame, events)
        elif t is MsgType.STEP:
            self._on_step(msg, events)
        elif t is MsgType.COMMIT:
            self._on_commit(msg, events)
        elif t is MsgType.RESET:
            self._on_reset(msg, events)
        else:  # REFUSAL from the verifier: the table closed the connection
            events.append(SessionRefused(Reason(msg.reason), msg.detail, by_peer=True))

    def _on_hello(self, hello: Hello, events: list) -> None:
        self.session = hello.session
        ours = self.config
        try:
            version, limits = negotiate(hello, ours.versions, ours.identity, ours.limits)
            if self.sessions is not None:  # last: a session is held once this passes
                self.sessions.open(self, hello.session)
        except RemoteProtocolError as e:
            conn_event(self, Pseudo.REFUSE)
            self._outbox.append(encode(Refusal(
                session=hello.session, slot=CONNECTION_SLOT, generation=0, round_id=0,
                reason=e.reason, detail=e.detail[:200])))
            differs = identity_differences(ours.identity, hello.identity)
            events.append(SessionRefused(e.reason, f"{e.detail} ({differs})" if differs
                                         and e.reason is Reason.WRONG_IDENTITY else e.detail,
                                         by_peer=False))
            return
        conn_event(self, Dir.RECV, MsgType.HELLO)
        self._start_session(version, limits, hello.identity)
        self._outbox.append(encode(HelloAnswer(
            session=hello.session, version=version, identity=ours.identity, limits=limits,
            revision=WIRE_REVISION)))
        events.append(SessionStarted(hello.session, version, limits, hello.identity))

    def _on_step(self, step: Step, events: list) -> None:
        try:
            s = self._slot(step.slot, RemoteProtocolError)
            check_step(step, self.version, self.limits)
            self._check_step_keys(step, s)
            check_step_context(step, s)
            slot_event(self.role, s, Dir.RECV, MsgType.STEP)
        except RemoteProtocolError as e:
            self._refuse(step, e.reason, e.detail, events)
            return
        s.begin(step)
        self.stepped = True
        events.append(StepRequested(step))

    def _check_step_keys(self, step: Step, s: SlotTrack) -> None:
        s.check_keys(step, RemoteProtocolError)
        if s.state is SlotState.IDLE and self.at_inflight_cap():
            raise RemoteProtocolError(Reason.TOO_MANY_INFLIGHT, f"{self.inflight} in flight")

    def _on_context(self, frame: Frame, events: list) -> None:
        ctx: Context = frame.message
        try:
            s = self._slot(ctx.slot, RemoteProtocolError)
        except RemoteProtocolError as e:
            events.append(ContextRefused(ctx.slot, ctx.generation, e.reason, e.detail))
            return
        with slot_transition(self.role, s, Dir.RECV, MsgType.CONTEXT):
            pass  # the table first: a CONTEXT under an outstanding step breaks the stream
        events.append(receive_context(frame, s, self.limits, self.vocab))

    def _refuse(self, step: Step, reason: Reason, detail: str, events: list) -> None:
        slot = step.slot if step.slot <= 0xFFFF else CONNECTION_SLOT
        self._outbox.append(encode(Refusal(
            session=self.session, slot=slot, generation=step.generation,
            round_id=step.round_id, reason=reason, detail=detail[:200])))
        events.append(StepRefused(step.slot, step.generation, step.round_id, reason, detail))

    def _on_commit(self, commit: Commit, events: list) -> None:
        s = self._slot(commit.slot, RemoteProtocolError)
        if (commit.generation, commit.round_id) != (s.generation, s.round_id):
            raise RemoteProtocolError(Reason.STATE_NOT_ALLOWED, "commit of another round")
        with slot_transition(self.role, s, Dir.RECV, MsgType.COMMIT):
            check_commit(commit, s.step, self.vocab)
            if commit.accepted > len(s.drafts):
                raise RemoteProtocolError(Reason.BAD_POSITION,
                                          f"accepted {commit.accepted} of {len(s.drafts)} drafts")
        s.committed = commit.committed
        new = s.drafts[:commit.accepted] + [commit.token]
        s.drafts = []
        if s.prefix is not None:  # inline, not worker_context: a COMMIT ends every round
            if len(s.prefix) + len(new) > self.limits.max_context:
                s.prefix = None  # cannot hold more: the next STEP is refused, not drafted
                s.context_error = RemoteProtocolError(Reason.CONTEXT_TOO_LONG, "commit past max")
            else:
                s.prefix.extend(new)
        events.append(Committed(commit))

    def _on_reset(self, reset: Reset, events: list) -> None:
        s = self._slot(reset.slot, RemoteProtocolError)
        was_drafting = s.state is SlotState.DRAFTING and s.generation <= reset.generation
        if s.generation <= reset.generation:
            slot_event(self.role, s, Dir.RECV, MsgType.RESET)
        s.invalidate(reset.generation)
        s.drafts = []  # speculative only; the committed prefix stays unless the request ended
        if reset.reason == Reason.CANCELLED:
            s.prefix = s.context_error = None
        events.append(SlotReset(reset.slot, reset.generation, Reason(reset.reason), was_drafting))

    # -- sending ------------------------------------------------------------

    def is_live(self, slot: int, generation: int, round_id: int) -> bool:
        """Whether replies for this step may still be sent (not reset, not completed)."""
        if self.state is not Conn.READY or not 0 <= slot < len(self.slots):
            return False
        s = self.slots[slot]
        return (s.state is SlotState.DRAFTING and not s.is_dead(generation)
                and (generation, round_id) == (s.generation, s.round_id))

    def context(self, slot: int) -> list[int]:
        """The committed prefix slot ``slot`` drafts after (valid once a STEP passed)."""
        s = self._slot(slot, LocalProtocolError)
        if s.prefix is None:
            raise LocalProtocolError(Reason.NO_CONTEXT, f"slot {slot} holds no context")
        return s.prefix.tokens

    def contexts_held(self) -> int:
        return sum(1 for s in self.slots if s.prefix is not None)

    def completion(self, slot: int, status: Status = Status.OK,
                   reason: Reason | str = "") -> Completion:
        """The COMPLETION of the slot's outstanding step, totals filled in."""
        return completion_of(self.session, slot, self._slot(slot, LocalProtocolError),
                             status, reason)

    def send(self, msg: Message) -> bytes:
        """Validate ``msg`` against the tables and the step it answers; return its frame."""
        return b"".join(self.send_parts(msg))

    def send_parts(self, msg: Message) -> tuple:
        """``send`` without joining the frame: (header + control, *payload buffers), the
        payload buffers the message's own arrays (see ``encode_parts``)."""
        t = type_of(msg)
        require_ready(self)
        self._check_session(msg, LocalProtocolError)
        if t is MsgType.REFUSAL:
            return encode_parts(msg)
        if t not in (MsgType.REPLY, MsgType.COMPLETION, MsgType.PROPOSAL):
            raise LocalProtocolError(Reason.STATE_NOT_ALLOWED, f"worker cannot send {t.name}")
        self._slot(msg.slot, LocalProtocolError)
        s = self._live_slot(msg.slot, msg.generation, msg.round_id)
        with slot_transition(self.role, s, Dir.SEND, t):  # applied once the checks pass
            if t is MsgType.REPLY:
                parts = self._reply_frame(msg, s)
            elif t is MsgType.PROPOSAL:
                check_own_proposal(msg, s, self.limits, self.vocab, self.check_outgoing)
                parts = encode_parts(msg)
                book_proposal(s, msg.tokens, sum(map(len, parts)), msg.row_checksums)
            else:
                check_own_completion(msg, s)
                parts = encode_parts(msg)
        return parts

    def _reply_frame(self, reply: Reply, s: SlotTrack) -> tuple:
        check_order(reply.index, s)
        if self.check_outgoing:
            check_own_reply(reply, s.step, self.limits, self.vocab)
        parts = encode_parts(reply)
        book_reply(s, int(reply.token), sum(map(len, parts)), payload_checksum_of(parts[0]))
        return parts

    def send_row(self, step: Step, index: int, token: int, row: DyadicRow | None,
                 form: Form, dense_row: ZeroRow | None = None) -> tuple:
        """The REPLY of row ``index`` of the outstanding ``step``, as drafted: what
        ``send_parts(reply_from_row(...))`` returns for it, the head filled in from the
        STEP. Without our own row checks a drafted row (sparse, or dense into
        ``dense_row``) is framed straight from its fields, no Reply built: a sparse one
        in one buffer, a dense one as (header + control, q) with q read from
        ``dense_row`` (as for ``reply_from_row``: frame it before its next fill)."""
        try:  # a drafter's numpy integer is no msgpack int; a float is never cut to one
            token = operator.index(token)
        except TypeError:
            raise LocalProtocolError(Reason.MALFORMED_CONTROL, f"token {token!r}") from None
        dense = form is Form.DENSE and dense_row is not None
        if self.check_outgoing or row is None or not (dense or form is Form.SPARSE):
            return self.send_parts(reply_from_row(
                session=self.session, slot=step.slot, generation=step.generation,
                round_id=step.round_id, index=index, position=step.first_position + index - 1,
                token=token, row=row, form=form, dense_len=self.limits.dense_len,
                dense_row=dense_row))
        s = self._live_slot(step.slot, step.generation, step.round_id)
        check_order(index, s)
        require_own_token(row, token)  # never ship a token its own q could not have drawn
        head = (self.session, step.slot, step.generation, step.round_id, index,
                step.first_position + index - 1, token)
        if dense:
            n = self.limits.dense_len
            if n < row.vocab:
                raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"dense_len {n} < vocab")
            q = dense_row.fill(n, row)  # native FP32, C-contiguous
            parts, payload_sum = encode_fields_parts(
                MsgType.REPLY, (*head, _DENSE, n),
                (memoryview(q if _NATIVE_LE else q.astype("<f4")).cast("B"),))
            nbytes = len(parts[0]) + 4 * n
        else:
            ids, q = row.to_sparse()  # int32 ids (DyadicRow casts them), FP32 q: LE on LE
            frame, payload_sum = encode_fields(
                MsgType.REPLY, (*head, _SPARSE, ids.size),
                (ids, q) if _NATIVE_LE else (ids.astype("<i4"), q.astype("<f4")))
            parts, nbytes = (frame,), len(frame)
        slot_event(self.role, s, Dir.SEND, MsgType.REPLY)  # once every check above passed
        book_reply(s, token, nbytes, payload_sum)
        return parts

    def send_proposal(self, step: Step, tokens, rows) -> bytes:
        """The PROPOSAL of the outstanding sparse ``step``: ``rows[i]`` the q that sampled
        ``tokens[i]``, every position drafted (``sizes.proposal_fits(step)`` must hold).
        What ``send_parts(proposal_from_rows(...))`` returns, in one buffer."""
        try:  # a drafter's numpy integer is no msgpack int; a float is never cut to one
            tokens = [operator.index(t) for t in tokens]
        except TypeError:
            raise LocalProtocolError(Reason.MALFORMED_CONTROL, f"tokens {tokens!r}") from None
        head = dict(session=self.session, slot=step.slot, generation=step.generation,
                    round_id=step.round_id, first_position=step.first_position,
                    context_version=step.context_version)
        if self.check_outgoing:
            return b"".join(self.send_parts(proposal_from_rows(**head, tokens=tokens,
                                                               rows=rows)))
        s = self._live_slot(step.slot, step.generation, step.round_id)
        words, entries, sums = pack_rows(tokens, rows)
        prop = Proposal(**head, tokens=tokens, entries=entries, row_checksums=sums)
        check_own_proposal(prop, s, self.limits, self.vocab, False)
        frame, _ = encode_fields(MsgType.PROPOSAL, (
            self.session, step.slot, step.generation, step.round_id, step.first_position,
            step.context_version, tokens, entries, sums),
            (words,))
        slot_event(self.role, s, Dir.SEND, MsgType.PROPOSAL)  # once every check above passed
        book_proposal(s, tokens, len(frame), sums)
        return frame

    def send_completion(self, slot: int, status: Status = Status.OK,
                        reason: Reason | str = "") -> bytes:
        """The frame of ``completion(slot, status, reason)``: the step's totals as we
        counted them (``send`` of a Completion built elsewhere checks it against them)."""
        s = self._slot(slot, LocalProtocolError)
        step = s.step
        if step is None or not self.is_live(slot, step.generation, step.round_id):
            raise LocalProtocolError(Reason.STALE_GENERATION, "step reset, completed or unknown")
        done = completion_of(self.session, slot, s, status, reason)
        with slot_transition(self.role, s, Dir.SEND, MsgType.COMPLETION):
            check_completion(done, s)
            return encode_fields(MsgType.COMPLETION, done)[0]

    def _live_slot(self, slot: int, generation: int, round_id: int) -> SlotTrack:
        if not self.is_live(slot, generation, round_id):
            raise LocalProtocolError(Reason.STALE_GENERATION, "step reset, completed or unknown")
        return self.slots[slot]

