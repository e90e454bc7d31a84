"""An in-process worker for the verifier link's tests: the real sans-IO WorkerEndpoint
behind an asyncio server on 127.0.0.1, with the golden vectors' small shapes
(vocabulary 16, 4 slots), drafting rows the way wire_helpers does.

``mode`` says what it does with each STEP it accepts: ``answer`` (REPLY rows and a
COMPLETION), ``hang`` (nothing: the connection stays open, the STEP never completes) or
``refuse`` (a REFUSAL for the step). ``refuse_connection()`` sends a connection-level
REFUSAL (slot -1) on every open connection, as a worker that ends a session would.
"""

from __future__ import annotations

import asyncio
import contextlib

from wire_helpers import config, worker_frames

from pp1q.core.errors import Reason
from pp1q.wire import CONNECTION_SLOT, Refusal, Step, WorkerEndpoint, encode
from pp1q.wire.events import SlotReset, StepRequested

MODES = ("answer", "hang", "refuse")


class FakeWorker:
    def __init__(self, mode: str = "answer", versions=(2,), after_hello: bytes = b"",
                 limits=None) -> None:
        assert mode in MODES
        self.mode = mode
        self.limits = limits  # the capacity it offers (None: the golden vectors' LIMITS)
        self.after_hello = after_hello  # bytes sent in the same write as the HELLO answer
        self.versions = versions  # wire versions it accepts: (1,) refuses a v2 HELLO
        self.hellos = 0  # HELLOs received (each connection says one)
        self.steps: list[Step] = []  # STEPs accepted, in order
        self.resets: list[SlotReset] = []  # RESETs received, in order
        self._conns: list[tuple[WorkerEndpoint, asyncio.Transport]] = []
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Conn(self), "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        for _ep, transport in self._conns:
            transport.close()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):  # bounded: from Python 3.12 it waits for
                await asyncio.wait_for(self._server.wait_closed(), 5.0)  # every connection

    def refuse_connection(self, reason: Reason = Reason.PEER_REFUSED) -> None:
        for ep, transport in self._conns:
            if ep.session is not None and not transport.is_closing():
                transport.write(encode(Refusal(session=ep.session, slot=CONNECTION_SLOT,
                                               generation=0, round_id=0, reason=reason,
                                               detail="the fake worker ends the session")))

    def on_step(self, ep: WorkerEndpoint, transport, step: Step) -> None:
        self.steps.append(step)
        if self.mode == "answer":
            transport.write(worker_frames(ep, step))
        elif self.mode == "refuse":
            transport.write(encode(Refusal(session=step.session, slot=step.slot,
                                           generation=step.generation, round_id=step.round_id,
                                           reason=Reason.WORKER_ABORTED,
                                           detail="the fake worker refuses")))


class _Conn(asyncio.Protocol):
    def __init__(self, owner: FakeWorker) -> None:
        self.owner = owner
        self.ep = WorkerEndpoint(config(versions=owner.versions) if owner.limits is None
                                 else config(versions=owner.versions, limits=owner.limits))
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.owner._conns.append((self.ep, transport))

    def data_received(self, data: bytes) -> None:
        hello_before = self.ep.session is None
        events = self.ep.receive_data(data, 0.0)
        out = self.ep.data_to_send()
        if hello_before and self.ep.session is not None:
            self.owner.hellos += 1
            out += self.owner.after_hello
        if out:
            self.transport.write(out)
        for ev in events:
            if isinstance(ev, StepRequested):
                self.owner.on_step(self.ep, self.transport, ev.step)
            elif isinstance(ev, SlotReset):
                self.owner.resets.append(ev)

    def connection_lost(self, exc) -> None:
        self.owner._conns = [c for c in self.owner._conns if c[1] is not self.transport]
