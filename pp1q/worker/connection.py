"""The worker's asyncio adapter: one BufferedProtocol per accepted TCP connection.

The first bytes tell the two kinds of connection apart (``pp1q.wire.sniff``): the
context preamble opens a context channel, anything else is a wire v2 connection whose bytes go to a
sans-IO ``WorkerEndpoint``. Wire bytes are received straight into the endpoint's own
buffers (``get_buffer``/``buffer_updated``: a dense payload lands without a copy).
"""

from __future__ import annotations

import asyncio
import logging

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.runtime.metrics import Metrics
from pp1q.wire import SNIFF_BYTES, Stream, WireConfig, WorkerEndpoint, sniff
from pp1q.wire import context_channel as cc
from pp1q.wire.events import (
    Committed,
    SessionRefused,
    SessionStarted,
    SlotReset,
    StepRefused,
    StepRequested,
)
from pp1q.worker.drafting import Proposer, StepDrafter
from pp1q.worker.state import StateRefusedError, WorkerState

log = logging.getLogger("pp1q.worker")

_SCRATCH_BYTES = 64 * 1024  # context-channel receive size (asyncio's default read size)


class WorkerConnection(asyncio.BufferedProtocol):
    def __init__(self, config: WireConfig, state: WorkerState, proposer: Proposer,
                 metrics: Metrics, on_close=None, check_outgoing: bool = True) -> None:
        self.config, self.state, self.proposer, self.metrics = config, state, proposer, metrics
        self._check_outgoing = check_outgoing
        self._on_close = on_close
        self.transport: asyncio.Transport | None = None
        self._sniff = bytearray(SNIFF_BYTES)
        self._sniffed = 0
        self._mode: str | None = None  # None until sniffed, then "wire" or "context"
        self.endpoint: WorkerEndpoint | None = None
        self.drafter: StepDrafter | None = None
        self._ctx: cc.ContextDecoder | None = None
        self._scratch = memoryview(bytearray(_SCRATCH_BYTES))
        self._drain: asyncio.Future | None = None
        self._out: list[bytes] = []  # frames of this loop tick, not yet written
        self._session: int | None = None

    # -- asyncio.BufferedProtocol ------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._mode is None:
            return memoryview(self._sniff)[self._sniffed:]
        if self._mode == "wire":
            return self.endpoint.get_buffer(sizehint)
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        now = asyncio.get_running_loop().time()
        try:
            if self._mode is None:
                self._sniffed += nbytes
                if self._sniffed == SNIFF_BYTES:
                    self._choose_mode(now)
            elif self._mode == "wire":
                self._on_wire_events(self.endpoint.buffer_updated(nbytes, now))
            else:
                for msg in self._ctx.feed(self._scratch[:nbytes]):
                    self._on_context(msg)
        except RemoteProtocolError as e:
            log.warning("closing connection: %s", e)
            self.metrics.validation_failure(e.reason)
            self.close()

    def pause_writing(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    def connection_lost(self, exc) -> None:
        if self._on_close is not None:
            self._on_close(self)
        if self.drafter is not None:
            self.drafter.cancel_all()
        if self._session is not None:
            self.state.close_session(self._session)
            self.metrics.slots_in_use.set(self.state.slots_held())
        self.resume_writing()

    # -- wire ----------------------------------------------------------------

    def _choose_mode(self, now: float) -> None:
        head = bytes(self._sniff)
        if sniff(head) is Stream.CONTEXT:
            self._mode, self._ctx = "context", cc.ContextDecoder()
            return
        self._mode = "wire"
        self.endpoint = WorkerEndpoint(self.config, check_outgoing=self._check_outgoing)
        self.drafter = StepDrafter(self.endpoint, self.state, self.proposer, self.metrics,
                                   self._write, lambda: self._drain)
        self._on_wire_events(self.endpoint.receive_data(head, now))

    def _on_wire_events(self, events) -> None:
        ep = self.endpoint
        for ev in events:
            if isinstance(ev, StepRequested):
                self.drafter.start(ev.step)
            elif isinstance(ev, Committed):
                c = ev.commit
                try:
                    self.state.commit(ep.session, c.slot, c.generation, c.round_id, c.accepted,
                                      c.token, c.committed)
                except StateRefusedError as e:  # the next STEP's digest check will refuse it
                    log.warning("commit not applied: %s", e)
            elif isinstance(ev, SlotReset):
                self.drafter.cancel(ev.slot)
                self.state.reset(ep.session, ev.slot, ev.generation)
                if ev.reason is not Reason.CANCELLED:  # a discarded proposal, not a release
                    self.metrics.generation_invalidations.inc()
                self.metrics.slots_in_use.set(self.state.slots_held())
            elif isinstance(ev, StepRefused):
                self.metrics.validation_failure(ev.reason)
            elif isinstance(ev, SessionStarted):
                self._open_session(ev)
            elif isinstance(ev, SessionRefused):
                log.warning("HELLO refused (%s): %s", ev.reason.value, ev.detail)
                self.metrics.validation_failure(ev.reason)
                if not ev.by_peer:  # we refused its HELLO (not its REFUSAL of ours)
                    self.metrics.hello_refused(ev.reason)
        out = ep.data_to_send()
        if out:
            self._write(out)
        if isinstance(events, list) and any(isinstance(e, SessionRefused) for e in events):
            self.close()

    def _open_session(self, ev: SessionStarted) -> None:
        try:
            self.state.open_session(ev.session)
        except StateRefusedError as e:
            log.warning("session refused: %s", e)
            self.close()
            return
        self._session = ev.session
        log.info("session %016x started: wire v%d, %d slots, depth <= %d, support <= %d",
                 ev.session, ev.version, ev.limits.max_slots, ev.limits.max_depth,
                 ev.limits.max_support)

    # -- context channel -------------------------------------------------------

    def _on_context(self, msg) -> None:
        if not isinstance(msg, cc.SetContext):
            raise RemoteProtocolError(Reason.STATE_NOT_ALLOWED, "only SetContext goes to a worker")
        try:
            prefix = self.state.set_context(msg.session, msg.slot, msg.generation, msg.tokens,
                                            msg.digest)
        except StateRefusedError as e:
            answer = cc.ContextRefused(msg.session, msg.slot, msg.generation, e.reason.value)
        else:
            answer = cc.ContextAck(msg.session, msg.slot, msg.generation, len(prefix),
                                   prefix.digest)
        self.metrics.slots_in_use.set(self.state.slots_held())
        self._write(cc.encode(answer))

    # -- output ------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        """Queue ``data``; everything queued in one loop tick leaves in one writelines
        (one writev: uvloop writes each ``write`` at once, one syscall per frame)."""
        if self.transport is not None and not self.transport.is_closing():
            if self._mode == "wire":
                self.metrics.reply_bytes.inc(len(data))
            self._out.append(data)
            if len(self._out) == 1:
                asyncio.get_running_loop().call_soon(self._flush_out)

    def _flush_out(self) -> None:
        out, self._out = self._out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)

    def close(self) -> None:
        if self.transport is not None:
            self._flush_out()  # a queued REFUSAL goes out before the close
            self.transport.close()

