"""VerifierEndpoint: the sans-IO verifier side of one connection to a worker.

Sends HELLO, CONTEXT, STEP, COMMIT, RESET; receives REPLY and COMPLETION, or one
PROPOSAL (a sparse step's rows and totals at once). A proposal is handed out
(``ProposalReady``) only after its COMPLETION matched every byte, or its PROPOSAL every
check; any failure before that (``ProposalFailed``) invalidates the generation at once, so
late frames of it are discarded and counted, never consumed.
"""

from __future__ import annotations

from pp1q.core.errors import LocalProtocolError, Reason, RemoteProtocolError, RowValidationError
from pp1q.wire.endpoint import Endpoint, SlotTrack, WireConfig
from pp1q.wire.events import (
    Discarded,
    ProposalFailed,
    ProposalReady,
    SessionRefused,
    SessionStarted,
)
from pp1q.wire.framing import Frame, chain_checksum, encode
from pp1q.wire.limits import DEFAULT_STEP_TIMEOUT_S
from pp1q.wire.messages import (
    CONNECTION_SLOT,
    WIRE_REVISION,
    WIRE_V2,
    Completion,
    Form,
    Hello,
    HelloAnswer,
    Message,
    MsgType,
    Proposal,
    Reply,
    Step,
    type_of,
)
from pp1q.wire.pool import PayloadPool
from pp1q.wire.sizes import proposal_fits
from pp1q.wire.table import (
    Conn,
    Dir,
    Pseudo,
    Role,
    SlotState,
    conn_event,
    conn_transition,
    require_ready,
    slot_event,
    slot_transition,
)
from pp1q.wire.validate import (
    Rows,
    check_abort_reason,
    check_answer_limits,
    check_commit,
    check_completion,
    check_context,
    check_identity,
    check_proposal,
    check_reply,
    check_revision,
    check_step,
    step_form,
)

_ROW_ERRORS = (RowValidationError, RemoteProtocolError)
# enum members as plain names where every frame reads them: Python 3.11 takes ~0.1 us to
# look up an enum member, several times a frame
_HELLO_SENT, _STEPPING, _RECV = Conn.HELLO_SENT, SlotState.STEPPING, Dir.RECV
_REPLY, _COMPLETION, _REFUSAL = MsgType.REPLY, MsgType.COMPLETION, MsgType.REFUSAL
_PROPOSAL, _SPARSE = MsgType.PROPOSAL, int(Form.SPARSE)  # int: as a decoded REPLY has it


class VerifierEndpoint(Endpoint):
    role = Role.VERIFIER

    def __init__(
        self, config: WireConfig, *, session: int,
        step_timeout: float = DEFAULT_STEP_TIMEOUT_S, pool: PayloadPool | None = None,
    ) -> None:
        super().__init__(config, pool)
        if not 0 <= session < 1 << 64:
            raise LocalProtocolError(Reason.WRONG_IDENTITY, "session id must be a u64")
        self.session = session
        self.step_timeout = float(step_timeout)

    # -- sending ------------------------------------------------------------

    def hello(self) -> bytes:
        """The first frame of the connection."""
        c = self.config
        return self.send(Hello(session=self.session, versions=list(c.versions),
                               identity=c.identity, limits=c.limits,
                               revision=WIRE_REVISION))

    def send(self, msg: Message, now: float | None = None) -> bytes:
        """Validate ``msg`` against the state tables and session, return its frame.

        A STEP needs ``now``: its deadline is ``now + step_timeout``.
        """
        t = type_of(msg)
        if t is MsgType.HELLO:
            conn_event(self, Dir.SEND, t)
            return encode(msg)
        require_ready(self)
        self._check_session(msg, LocalProtocolError)
        if t is MsgType.REFUSAL:
            return encode(msg)
        if t not in (MsgType.CONTEXT, MsgType.STEP, MsgType.COMMIT, MsgType.RESET):
            raise LocalProtocolError(Reason.STATE_NOT_ALLOWED, f"verifier cannot send {t.name}")
        s = self._slot(msg.slot, LocalProtocolError)
        with slot_transition(self.role, s, Dir.SEND, t):  # applied once the checks pass
            if t is MsgType.STEP:
                self._check_new_step(msg, s, now)
            elif t is MsgType.CONTEXT:
                if s.is_dead(msg.generation) or msg.generation < s.generation:
                    raise LocalProtocolError(Reason.STALE_GENERATION,
                                             "context of a dead generation")
                check_context(msg, self.limits, self.vocab, LocalProtocolError)
            elif t is MsgType.COMMIT:
                if (msg.generation, msg.round_id) != (s.generation, s.round_id):
                    raise LocalProtocolError(Reason.STALE_GENERATION, "commit of another round")
                check_commit(msg, s.step, self.vocab, LocalProtocolError)
        if t is MsgType.STEP:
            s.begin(msg)
            s.deadline = now + self.step_timeout
        elif t is MsgType.COMMIT:
            s.committed = msg.committed
        elif t is MsgType.CONTEXT:
            pass  # the worker's copy is the scheduler's to track (STEP digests prove it)
        else:  # RESET: every generation <= msg.generation of this slot dies now
            s.invalidate(msg.generation)
        return encode(msg)

    def check_timeouts(self, now: float) -> list[ProposalFailed]:
        """STEPs past their deadline fail now (watchdog); RESET them next."""
        out = []
        for i, s in enumerate(self.slots):
            if s.state is SlotState.STEPPING and s.deadline is not None and now >= s.deadline:
                out.append(self._fail(i, s, Pseudo.TIMEOUT, Reason.STEP_TIMEOUT, "deadline"))
        return out

    def next_deadline(self) -> float | None:
        """Earliest STEP deadline (for the caller's timer), or None."""
        ds = [s.deadline for s in self.slots if s.state is SlotState.STEPPING and s.deadline]
        return min(ds) if ds else None

    def close(self, reason: Reason = Reason.CONNECTION_LOST) -> list[ProposalFailed]:
        """The connection is gone: every outstanding step fails. Proposals already
        handed out stay valid; nothing more can be sent on this endpoint."""
        out = [self._fail(i, s, Pseudo.LOST, reason, "connection closed")
               for i, s in enumerate(self.slots) if s.state is SlotState.STEPPING]
        conn_event(self, Pseudo.CLOSE)  # a broken (ERROR) connection stays broken
        return out

    def _check_new_step(self, step: Step, s: SlotTrack, now: float | None) -> None:
        if now is None:
            raise LocalProtocolError(Reason.STATE_NOT_ALLOWED, "send(STEP) needs now")
        check_step(step, self.version, self.limits, LocalProtocolError)
        s.check_keys(step, LocalProtocolError)
        if self.at_inflight_cap():  # the slot is IDLE here: the table allowed this STEP
            raise LocalProtocolError(Reason.TOO_MANY_INFLIGHT, f"{self.inflight} in flight")

    # -- receiving ----------------------------------------------------------

    def _on_frame(self, frame: Frame, now: float, events: list) -> None:
        msg = frame.message
        t = type_of(msg)
        if self.state is _HELLO_SENT:
            self._on_handshake(msg, t, events)
            return
        conn_event(self, _RECV, t)
        self._check_session(msg, RemoteProtocolError)
        if t is _REFUSAL and msg.slot == CONNECTION_SLOT:
            events.extend(self.close(Reason.PEER_REFUSED))
            events.append(SessionRefused(Reason(msg.reason), msg.detail, by_peer=True))
            return
        s = self._slot(msg.slot, RemoteProtocolError)
        live = (s.state is _STEPPING
                and msg.generation == s.generation and msg.round_id == s.round_id)
        if not live:
            self._discard_or_raise(frame, s, t, events)
            return
        if t is _REPLY:
            slot_event(self.role, s, _RECV, t)
            self._on_reply(frame, s, events)
        elif t is _COMPLETION:
            self._on_completion(msg, s, events)
        elif t is _PROPOSAL:
            self._on_proposal(frame, s, events)
        else:  # the worker refused the step: the table fails the slot
            events.append(self._fail(msg.slot, s, t, Reason(msg.reason),
                                     f"peer: {msg.detail}", by_peer=True))

    def _on_handshake(self, msg, t: MsgType, events: list) -> None:
        if t is MsgType.REFUSAL:
            conn_event(self, Dir.RECV, t)
            events.append(SessionRefused(Reason(msg.reason), msg.detail, by_peer=True))
            return
        ans: HelloAnswer = msg
        with conn_transition(self, Dir.RECV, t):  # READY once the answer checks pass
            self._check_session(ans, RemoteProtocolError)
            check_revision(ans.revision)
            if ans.version not in self.config.versions:
                raise RemoteProtocolError(
                    Reason.SPECULATION_NOT_ENABLED if ans.version == WIRE_V2
                    else Reason.BAD_VERSION, f"answered version {ans.version}")
            check_identity(self.config.identity, ans.identity)
            check_answer_limits(self.config.limits, ans.limits, self.vocab)
        self._start_session(ans.version, ans.limits, ans.identity)
        events.append(SessionStarted(self.session, ans.version, ans.limits, ans.identity))

    def _discard_or_raise(self, frame: Frame, s: SlotTrack, t: MsgType, events: list) -> None:
        msg = frame.message
        if s.is_dead(msg.generation):
            reason = Reason.STALE_GENERATION
        elif msg.generation == s.generation and msg.round_id <= s.round_id:
            reason = Reason.DUPLICATE_ROUND  # an older round, or one already handed out
        else:
            raise RemoteProtocolError(
                Reason.STATE_NOT_ALLOWED,
                f"{t.name} for slot {msg.slot} gen {msg.generation} round {msg.round_id}"
                f" (slot {s.state})",
            )
        self.discarded[reason] += 1
        events.append(Discarded(msg.slot, msg.generation, msg.round_id, t, reason, frame.nbytes))

    def _on_reply(self, frame: Frame, s: SlotTrack, events: list) -> None:
        reply: Reply = frame.message
        slot = reply.slot
        expected = len(s.frames) + 1
        if reply.index != expected or expected > s.step.depth:
            if reply.index > s.step.depth:
                reason = Reason.DEPTH_TOO_LARGE
            elif reply.index < expected:
                reason = Reason.DUPLICATE_ROUND
            else:
                reason = Reason.OUT_OF_ORDER
            self._fail_into(events, slot, s, reason, f"reply {reply.index}, want {expected}")
            return
        if frame.error is not None:
            self._fail_into(events, slot, s, frame.error.reason, frame.error.detail)
            return
        try:
            row = check_reply(reply, s.step, self.vocab, RemoteProtocolError, frame.q_checked)
        except _ROW_ERRORS as e:
            self._fail_into(events, slot, s, e.reason, e.detail)
            return
        s.frames.append(reply)
        s.rows.append(row)
        s.reply_bytes += frame.nbytes
        s.checksums.append(frame.payload_checksum)

    def _on_completion(self, c: Completion, s: SlotTrack, events: list) -> None:
        check_abort_reason(c)
        try:
            check_completion(c, s.step, len(s.frames), s.reply_bytes, chain_checksum(s.checksums))
        except RemoteProtocolError as e:
            detail = e.detail if c.status == 0 else c.reason
            self._fail_into(events, c.slot, s, e.reason, detail)
            return
        slot_event(self.role, s, Dir.RECV, MsgType.COMPLETION)  # READY: handed out next
        s.deadline = None
        greedy = step_form(s.step) is Form.TOKEN_ONLY
        events.append(ProposalReady(  # positional (keywords cost a third more): in field order
            c.slot, c.generation, c.round_id, s.step.first_position,
            tuple([r.token for r in s.frames]),  # ints: msgspec decoded them as I32
            () if greedy else Rows(s.frames, s.rows, self.vocab), tuple(s.frames), greedy,
            proposal_fits(s.step, self.limits),  # fits: a PROPOSAL would have carried it
        ))
        s.frames, s.rows = [], []

    def _on_proposal(self, frame: Frame, s: SlotTrack, events: list) -> None:
        prop: Proposal = frame.message
        slot = prop.slot
        if s.frames:  # the step is being answered row by row: a whole proposal now is not
            self._fail_into(events, slot, s, Reason.OUT_OF_ORDER, "PROPOSAL after a REPLY")
            return
        if frame.error is not None:
            self._fail_into(events, slot, s, frame.error.reason, frame.error.detail)
            return
        try:
            rows = check_proposal(prop, s.step, self.vocab, words=frame.words)
        except _ROW_ERRORS as e:
            self._fail_into(events, slot, s, e.reason, e.detail)
            return
        slot_event(self.role, s, _RECV, _PROPOSAL)  # READY: handed out next
        s.deadline = None
        first = prop.first_position
        # each position as the REPLY that would have carried it (consumers read replies)
        head = (prop.session, slot, prop.generation, prop.round_id)
        rows_in = zip(prop.tokens, prop.entries, prop.ids, prop.q, strict=True)
        replies = tuple([Reply(*head, i, first + i - 1, token, _SPARSE, n, ids, q)
                         for i, (token, n, ids, q) in enumerate(rows_in, 1)])
        events.append(ProposalReady(  # positional, in field order (see _on_completion)
            slot, prop.generation, prop.round_id, first, tuple(prop.tokens),
            Rows(replies, rows, self.vocab), replies, False))

    def _fail_into(self, events: list, slot: int, s: SlotTrack, reason: Reason, detail: str):
        events.append(self._fail(slot, s, Pseudo.FAIL, reason, detail))

    def _fail(self, slot: int, s: SlotTrack, how: Pseudo | MsgType, reason: Reason,
              detail: str, by_peer: bool = False):
        """``how``: a pseudo event, or the received message type (the peer's REFUSAL)."""
        if isinstance(how, Pseudo):
            slot_event(self.role, s, how)
        else:
            slot_event(self.role, s, Dir.RECV, how)
        s.invalidate(s.generation)
        s.frames, s.rows = [], []
        self.failures[reason] += 1
        return ProposalFailed(slot, s.generation, s.round_id, Reason(reason), detail, by_peer)

