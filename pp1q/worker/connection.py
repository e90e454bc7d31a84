"""The worker's asyncio adapter: one BufferedProtocol per accepted TCP connection.

Every connection is one wire v2 session (revision 3: the request context travels in
CONTEXT frames on it, a fitting sparse step's answer in one PROPOSAL); its bytes go to a
sans-IO ``WorkerEndpoint``, received straight into the endpoint's own buffers
(``get_buffer``/``buffer_updated``: a dense payload lands without a copy).
"""

from __future__ import annotations

import asyncio
import logging

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.runtime.metrics import Metrics
from pp1q.wire import WireConfig, WorkerEndpoint
from pp1q.wire.events import (
    ContextReceived,
    ContextRefused,
    SessionRefused,
    SessionStarted,
    SlotReset,
    StepRefused,
    StepRequested,
)
from pp1q.wire.limits import Limits
from pp1q.wire.sessions import SessionTable
from pp1q.wire.table import Conn
from pp1q.worker.drafting import Proposer, StepDrafter

log = logging.getLogger("pp1q.worker")

# The drafter stops (pause_writing) only once this much is queued unsent: the asyncio
# default (64 KiB) stopped it after every dense REPLY (517 KB) until the kernel took the
# row, so building the next row no longer overlapped sending the last one. After HELLO the
# mark is one REPLY of every STEP the session may have outstanding (a loop tick's frames),
# never above this cap: how far ahead of the socket the drafter may run, in bytes it holds.
WRITE_HIGH_WATER_CAP = 64 << 20


def write_high_water(limits: Limits) -> int:
    """Unsent bytes at which drafting pauses, for a session's negotiated limits."""
    return min(WRITE_HIGH_WATER_CAP, limits.max_inflight * limits.max_payload)


class WorkerConnection(asyncio.BufferedProtocol):
    """One connection. What it may hold and for how long is ``sessions``' decision
    (pp1q.wire.sessions: admission, eviction) and its endpoint's (deadlines); this
    adapter applies them: one timer for the endpoint's next deadline, a close (after
    the REFUSAL the endpoint queued) for each connection the table names."""

    def __init__(self, config: WireConfig, sessions: SessionTable, proposer: Proposer,
                 metrics: Metrics, check_outgoing: bool = False) -> None:
        self.config, self.sessions, self.proposer, self.metrics = (
            config, sessions, proposer, metrics)
        self._check_outgoing = check_outgoing
        self.transport: asyncio.Transport | None = None
        self.endpoint = WorkerEndpoint(config, check_outgoing=check_outgoing, sessions=sessions,
                                       now=asyncio.get_running_loop().time())
        self.drafter = StepDrafter(self.endpoint, proposer, metrics, self._write,
                                   lambda: self._drain, self._drained, lambda: self._out_bytes,
                                   self._write_now)
        self._drain: asyncio.Future | None = None
        self._out: list[bytes] = []  # frames of this loop tick, not yet written
        self._out_bytes = 0  # their size
        self._session: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._shut = False  # closed by our bounds (counted there)

    # -- asyncio.BufferedProtocol ------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        now = asyncio.get_running_loop().time()
        try:
            victims = self.sessions.admit(self.endpoint, self, now)
        except RemoteProtocolError as e:  # no connection to replace (see SessionTable.admit)
            self.shut(e.reason)
            return
        self._close_victims(victims)
        self._arm()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.endpoint.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        now = asyncio.get_running_loop().time()
        try:
            self._on_wire_events(self.endpoint.buffer_updated(nbytes, now))
        except RemoteProtocolError as e:
            # str: a record keeps no traceback; one line a reason per interval (counted)
            self.metrics.logs.log(log, logging.WARNING, ("refused", e.reason),
                                  "closing connection: %s", str(e))
            self.metrics.validation_failure(e.reason)
            self.close()
        self._close_victims(self.sessions.take_victims())
        self._arm()

    def pause_writing(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.endpoint.state is Conn.IDLE and not self._shut:
            self.metrics.connection_closed(Reason.NO_HELLO)  # gone before its HELLO
        self.drafter.cancel_all()
        self.drafter.detach()  # its write hooks are ours: no cycle outlives the connection
        if self._session is not None:  # only the owner of a session: ids are unique (table)
            for slot in range(len(self.endpoint.slots)):
                self.proposer.forget((self._session, slot))  # its K/V: never reused
        self.sessions.release(self.endpoint)
        self.metrics.slots_in_use.set(self.sessions.slots_held())
        self.resume_writing()

    # -- the bounds ----------------------------------------------------------

    def _arm(self) -> None:
        """One timer at a time, at the endpoint's deadline; it re-arms if the deadline
        moved on (a frame heard, HELLO said) and stops once there is none."""
        due = self.endpoint.deadline()
        if due is not None and self._timer is None and not self._shut:
            self._timer = asyncio.get_running_loop().call_at(due[0], self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        reason = self.endpoint.expired(asyncio.get_running_loop().time())
        if reason is None:
            self._arm()
            return
        self.metrics.logs.log(log, logging.INFO, ("expired", reason),
                              "closing connection: %s", reason.value)
        self.shut(reason)

    def shut(self, reason: Reason) -> None:
        """Close on our bounds: the endpoint's REFUSAL (if it can still send one) first."""
        if self._shut:
            return
        self._shut = True
        self.metrics.connection_closed(reason)
        self.endpoint.expire(reason)
        self._write(self.endpoint.data_to_send())
        self.close()

    @staticmethod
    def _close_victims(victims) -> None:
        for owner, reason in victims:
            owner.metrics.logs.log(log, logging.INFO, ("victim", reason),
                                   "closing an older connection: %s", reason.value)
            owner.shut(reason)

    # -- wire ----------------------------------------------------------------

    def _on_wire_events(self, events) -> None:
        ep = self.endpoint
        for ev in events:
            if isinstance(ev, StepRequested):
                self.drafter.start(ev.step)
            elif isinstance(ev, ContextReceived):
                if ev.full:  # a whole prefix: the drafter prefills it ahead of the STEP
                    self.drafter.start_prefill((ep.session, ev.slot), ep.context(ev.slot))
                self.metrics.slots_in_use.set(self.sessions.slots_held())
            elif isinstance(ev, ContextRefused):
                log.info("context for slot %d refused: %s", ev.slot, ev.reason.value)
                self.metrics.validation_failure(ev.reason)
            elif isinstance(ev, SlotReset):
                self.drafter.cancel(ev.slot)
                self.proposer.discard((ep.session, ev.slot))
                if ev.reason is not Reason.CANCELLED:  # a discarded proposal, not a release
                    self.metrics.generation_invalidations.inc()
                self.metrics.slots_in_use.set(self.sessions.slots_held())
            elif isinstance(ev, StepRefused):
                self.metrics.validation_failure(ev.reason)
            elif isinstance(ev, SessionStarted):
                self._session = ev.session  # the table bound it to this connection
                self.transport.set_write_buffer_limits(high=write_high_water(ev.limits))
                log.info("session %016x started: wire v%d, %d slots, depth <= %d, "
                         "support <= %d, context <= %d", ev.session, ev.version,
                         ev.limits.max_slots, ev.limits.max_depth, ev.limits.max_support,
                         ev.limits.max_context)
            elif isinstance(ev, SessionRefused):
                # once per connection, as often as a peer reconnects: a line a reason
                # per interval (counted below)
                if ev.by_peer:  # its REFUSAL: the detail is the peer's text, quoted and
                    # escaped (%r) so that a newline in it cannot begin a line of its own
                    self.metrics.logs.log(log, logging.WARNING, ("peer_refused", ev.reason),
                                          "the verifier refused the session (%s): %r",
                                          ev.reason.value, ev.detail)
                else:  # we refused its HELLO: our detail (its identity's values as repr)
                    self.metrics.logs.log(log, logging.WARNING, ("hello", ev.reason),
                                          "HELLO refused (%s): %s", ev.reason.value,
                                          ev.detail)
                    self.metrics.hello_refused(ev.reason)
                self.metrics.validation_failure(ev.reason)
        out = ep.data_to_send()
        if out:
            self._write(out)
        if any(isinstance(e, SessionRefused) for e in events):
            self.close()

    # -- output ------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        """Queue ``data``; everything queued in one loop tick leaves in one writelines
        (one writev: uvloop writes each ``write`` at once, one syscall per frame), or
        earlier with a finished proposal (``_write_now``)."""
        if self.transport is not None and not self.transport.is_closing():
            self._out.append(data)
            self._out_bytes += len(data)
            if len(self._out) == 1:
                asyncio.get_running_loop().call_soon(self._flush_out)

    def _write_now(self, data: bytes) -> None:
        """``data`` and everything queued before it, handed to the transport now (a
        step's last frame: the drafter's proposal leaves while it drafts the next). Not
        through ``_write``: its tick-end flush would then find nothing to write (a loop
        callback a step for nothing)."""
        if self.transport is not None and not self.transport.is_closing():
            self._out.append(data)
            self._out_bytes += len(data)
            self._flush_out()

    def _drained(self) -> bool:
        """Nothing written is still held: none queued for this tick, none in the
        transport's buffer (a partial write keeps references to our buffers)."""
        return (not self._out and self.transport is not None
                and self.transport.get_write_buffer_size() == 0)

    def _flush_out(self) -> None:
        out, n, self._out, self._out_bytes = self._out, self._out_bytes, [], 0
        if out and self.transport is not None and not self.transport.is_closing():
            self.metrics.reply_bytes.inc(n)  # once a tick, not once a frame (a lock each)
            self.transport.writelines(out)

    def close(self) -> None:
        if self.transport is not None:
            self._flush_out()  # a queued REFUSAL goes out before the close
            self.transport.close()

