"""The worker's asyncio adapter: one BufferedProtocol per accepted TCP connection.

Every connection is one wire v2 session (revision 2: the request context travels in
CONTEXT frames on it); its bytes go to a sans-IO ``WorkerEndpoint``, received straight
into the endpoint's own buffers (``get_buffer``/``buffer_updated``: a dense payload
lands without a copy).
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
from pp1q.worker.drafting import Proposer, StepDrafter
from pp1q.worker.state import StateRefusedError, WorkerState

log = logging.getLogger("pp1q.worker")


class WorkerConnection(asyncio.BufferedProtocol):
    def __init__(self, config: WireConfig, state: WorkerState, proposer: Proposer,
                 metrics: Metrics, on_close=None, check_outgoing: bool = True) -> None:
        self.config, self.state, self.proposer, self.metrics = config, state, proposer, metrics
        self._check_outgoing = check_outgoing
        self._on_close = on_close
        self.transport: asyncio.Transport | None = None
        self.endpoint = WorkerEndpoint(config, check_outgoing=check_outgoing)
        self.drafter = StepDrafter(self.endpoint, proposer, metrics, self._write,
                                   lambda: self._drain)
        self._drain: asyncio.Future | None = None
        self._out: list[bytes] = []  # frames of this loop tick, not yet written
        self._session: int | None = None

    # -- asyncio.BufferedProtocol ------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.endpoint.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        now = asyncio.get_running_loop().time()
        try:
            self._on_wire_events(self.endpoint.buffer_updated(nbytes, now))
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
        self.drafter.cancel_all()
        if self._session is not None:
            for slot in range(len(self.endpoint.slots)):
                self.proposer.discard((self._session, slot))
            self.state.close_session(self._session)
            self.metrics.slots_in_use.set(self.state.slots_held())
        self.resume_writing()

    # -- wire ----------------------------------------------------------------

    def _on_wire_events(self, events) -> None:
        ep = self.endpoint
        for ev in events:
            if isinstance(ev, StepRequested):
                self.drafter.start(ev.step)
            elif isinstance(ev, ContextReceived):
                if ev.full:  # a whole prefix: the drafter fills its state once, here
                    self.proposer.prefill((ep.session, ev.slot), ep.context(ev.slot))
                self.metrics.slots_in_use.set(self.state.slots_held())
            elif isinstance(ev, ContextRefused):
                log.info("context for slot %d refused: %s", ev.slot, ev.reason.value)
                self.metrics.validation_failure(ev.reason)
            elif isinstance(ev, SlotReset):
                self.drafter.cancel(ev.slot)
                self.proposer.discard((ep.session, ev.slot))
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
            self.state.open_session(ev.session, self.endpoint)
        except StateRefusedError as e:
            log.warning("session refused: %s", e)
            self.close()
            return
        self._session = ev.session
        log.info("session %016x started: wire v%d, %d slots, depth <= %d, support <= %d",
                 ev.session, ev.version, ev.limits.max_slots, ev.limits.max_depth,
                 ev.limits.max_support)

    # -- output ------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        """Queue ``data``; everything queued in one loop tick leaves in one writelines
        (one writev: uvloop writes each ``write`` at once, one syscall per frame)."""
        if self.transport is not None and not self.transport.is_closing():
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

