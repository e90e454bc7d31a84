"""The verifier's transport adapter: one wire session to the worker (v2, or v1 when
greedy), kept alive.

``WorkerLink.run`` connects, says HELLO and, when the connection ends, fails every open
proposal and reconnects with exponential backoff; each new connection is a new session
id, so every key of the old one is dead. Bytes are received straight into the
endpoint's buffers (asyncio.BufferedProtocol, pp1q.verifier.link_protocol).

Proposals: ``propose(step)`` returns a future that resolves to the endpoint's
``ProposalReady`` or to a ``Fallback`` (cause + reason). STEPs submitted in the same
loop tick leave in one write (a batch); at most ``MAX_BATCHES_IN_FLIGHT`` batches are
outstanding (pp1q.verifier.steps_in_flight), later STEPs wait for one to resolve.
``send_context`` encodes a CONTEXT at once; the tick's flush writes it, on the same
connection, ahead of that tick's STEPs, so it always precedes the STEP that drafts after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import ssl
from dataclasses import dataclass

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.outcomes import FallbackCause
from pp1q.core.prefix import Prefix
from pp1q.runtime.capture import Protocol, tap
from pp1q.runtime.metrics import Metrics
from pp1q.runtime.tls import ClientTls, connect_kwargs
from pp1q.verifier.breaker import DEFAULT_BREAKER, Breaker, BreakerConfig
from pp1q.verifier.circuit import Circuit
from pp1q.verifier.link_health import link_health
from pp1q.verifier.link_protocol import WireProtocol
from pp1q.verifier.outcome import Fallback, classify
from pp1q.verifier.steps_in_flight import StepsInFlight, slot_buffers, slot_rows
from pp1q.verifier.watchdog import Watchdog
from pp1q.wire import (
    WIRE_V2,
    Commit,
    Reset,
    Step,
    VerifierEndpoint,
    WireConfig,
    context_of,
)
from pp1q.wire.events import (
    Discarded,
    ProposalFailed,
    ProposalReady,
    SessionRefused,
    SessionStarted,
)
from pp1q.wire.table import Conn
from pp1q.wire.validate import identity_named

log = logging.getLogger("pp1q.verifier")

HELLO_TIMEOUT_S = 5.0  # a worker that does not answer HELLO by then is treated as down
FIRST_BACKOFF_S = 0.05  # first reconnection delay; doubles up to reconnect_max_s


@dataclass(frozen=True)
class Needs:
    """What the scheduler needs from the negotiated limits (else HELLO is refused)."""

    slots: int
    depth: int
    support: int


class WorkerLink:
    def __init__(self, host: str, port: int, config: WireConfig, needs: Needs, metrics: Metrics,
                 step_timeout: float, reconnect_max_s: float, capture=None,
                 tls: ClientTls | None = None,
                 breaker: BreakerConfig = DEFAULT_BREAKER) -> None:
        self.host, self.port, self.config, self.needs = host, port, config, needs
        self.tls = tls  # mutual TLS for the connection to the worker; None: plain TCP
        self.capture = capture  # pp1q.runtime.capture.CaptureWriter or None
        self.metrics = metrics
        self.step_timeout = step_timeout
        self.reconnect_max_s = reconnect_max_s
        self.endpoint: VerifierEndpoint | None = None
        self.version: int | None = None
        self._proto: WireProtocol | None = None
        self._ready = False
        self._ready_event = asyncio.Event()
        self._started: asyncio.Future | None = None
        self._queued: list[tuple[Step, asyncio.Future]] = []
        self._in_flight = StepsInFlight(metrics.steps_in_flight)
        self._flush_scheduled = False
        self._controls: list[bytes] = []  # frames sent this tick, written with its STEPs
        self._watchdog = Watchdog(self._on_timeouts)
        self.sessions_started = 0
        self.refused: Reason | None = None  # the worker's last refusal of a session
        self.circuit = Circuit(Breaker(breaker), metrics)  # consulted before each STEP
        self._ended_by_refusal = False
        # every session reuses these buffers, allocated when the first v2 session is
        # negotiated (the design: negotiate before allocating; v1 and off never do)
        self.pool = slot_buffers(config.limits, allocate=False)

    # -- state -----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def session(self) -> int | None:
        return self.endpoint.session if self._ready else None

    def health(self) -> dict:
        """What /healthz says of the link (pp1q.verifier.link_health)."""
        return link_health(self._ready, self.refused, f"{self.host}:{self.port}", self.circuit)

    async def wait_ready(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready_event.wait(), timeout)
        return self._ready

    # -- connection loop ---------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        backoff = FIRST_BACKOFF_S
        while not stop.is_set():
            ok = await self._connect_once(stop)
            backoff = FIRST_BACKOFF_S if ok else min(backoff * 2, self.reconnect_max_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)

    async def _connect_once(self, stop: asyncio.Event) -> bool:
        """One connection's lifetime; True if a session was established."""
        loop = asyncio.get_running_loop()
        endpoint = VerifierEndpoint(self.config, session=secrets.randbits(64),
                                    step_timeout=self.step_timeout, pool=self.pool)
        try:
            _, proto = await loop.create_connection(
                tap(lambda: WireProtocol(self, endpoint), self.capture, Protocol.WIRE),
                self.host, self.port, **connect_kwargs(self.tls))
        except ssl.SSLError:  # a failed TLS handshake: counted and logged by pp1q.runtime.tls
            return False
        except OSError as e:
            # asyncio's strerror is "Connect call failed (addr)": the errno says why; a
            # resolver's (socket.gaierror: errno < 0, "Unknown error" to os) says it itself
            self._no_session("unreachable", os.strerror(e.errno) if e.errno and e.errno > 0
                             else e.strerror or str(e))
            return False
        self.endpoint, self._proto = endpoint, proto
        self._started = loop.create_future()
        self._ended_by_refusal = False
        proto.transport.write(endpoint.hello())
        try:
            done, _ = await asyncio.wait({self._started, proto.closed}, timeout=HELLO_TIMEOUT_S,
                                        return_when=asyncio.FIRST_COMPLETED)
            if self._started not in done:
                if proto.rejected is not None:  # its answer was invalid: logged as it came
                    return False
                self._no_session("no_answer", "the connection closed before HELLO was "
                                 "answered (as a TLS worker closes a plain one)"
                                 if proto.closed.done()
                                 else f"no HELLO answer within {HELLO_TIMEOUT_S:g} s")
                return False
            if not self._started.result():  # a refusal: logged as it came
                return False
            self._go_ready()
            stopping = loop.create_task(stop.wait())
            try:
                await asyncio.wait({proto.closed, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
            # a worker that ends each session with a REFUSAL is retried with backoff, not
            # at once: it counts as a failed connection
            return not self._ended_by_refusal
        finally:
            self._go_down(quiet=stop.is_set())

    def _no_session(self, kind: str, why: str) -> None:
        # /healthz says no_session; the log says why, once a kind per 10 s while it lasts
        # (before, a worker that could not be reached left the journal silent)
        self.metrics.logs.log(log, logging.WARNING, ("no_session", kind),
                              "no session with worker %s:%d: %s; retrying (every %g s at "
                              "most)", self.host, self.port, why, self.reconnect_max_s)

    def _go_ready(self) -> None:
        self.sessions_started += 1
        if self.sessions_started > 1:
            self.metrics.reconnects.inc()
        self.version = self.endpoint.version
        self.refused = None
        self._ready = True
        self._ready_event.set()
        self._watchdog.attach(self.endpoint)
        # the context: a round whose drafts would pass it runs target-only (the drafter's
        # own context, when the worker offered it)
        log.info("session %016x with worker %s:%d: wire v%d, context <= %d",
                 self.endpoint.session, self.host, self.port, self.version,
                 self.endpoint.limits.max_context)

    def _go_down(self, quiet: bool = False) -> None:
        was_ready = self._ready
        self._ready = False
        self._ready_event.clear()
        self._watchdog.attach(None)
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()
        if self.endpoint is not None:
            self.on_events(self.endpoint.close())
        for _step, fut in self._queued:  # never sent: the worker never drew for them
            if not fut.done():
                fut.set_result(Fallback(FallbackCause.CONNECTION_LOST, Reason.CONNECTION_LOST,
                                        "connection lost before the STEP left"))
        self._queued.clear()
        self._in_flight.clear()
        self._controls.clear()  # the dead session's frames: never written to a new one
        if was_ready and not quiet:
            log.warning("lost the worker session; reconnecting")

    # -- events ------------------------------------------------------------------

    def on_events(self, events, stream_error: bool = False) -> None:
        for ev in events:
            if isinstance(ev, ProposalReady):
                if ev.streamed_fitting:
                    self.metrics.proposals_streamed.inc()
                self._resolve(ev.slot, ev)
            elif isinstance(ev, ProposalFailed):
                cause = FallbackCause.INVALID_REPLY if stream_error else classify(ev)
                if cause is FallbackCause.INVALID_REPLY and not stream_error:
                    self.metrics.validation_failure(ev.reason)
                self._resolve(ev.slot, Fallback(cause, ev.reason, ev.detail))
            elif isinstance(ev, Discarded):
                self.metrics.late_reply(ev.reason)
            elif isinstance(ev, SessionStarted):
                self._check_session(ev)
            elif isinstance(ev, SessionRefused):
                # each reconnection is refused alike: a line a reason per interval; an
                # identity refusal names the fields, and this end adds its own values.
                # The detail is the peer's text: quoted and escaped (%r), so a newline in
                # it cannot begin a line of its own in the journal
                ours = (identity_named(self.config.identity, ev.detail)
                        if ev.reason is Reason.WRONG_IDENTITY else "")
                self.metrics.logs.log(log, logging.ERROR, ("session_refused", ev.reason),
                                      "worker refused the session (%s): %r%s",
                                      ev.reason.value, ev.detail, f" ({ours})" if ours else "")
                self.metrics.validation_failure(ev.reason)
                self.refused = ev.reason
                if self._started is not None and not self._started.done():
                    self._started.set_result(False)
                elif self._proto is not None:  # mid-session (slot -1): the session is over;
                    self._ended_by_refusal = True  # close, reconnect with backoff (wire.md)
                    self._proto.transport.close()
        self._watchdog.arm()

    def _check_session(self, ev: SessionStarted) -> None:
        lim, need = ev.limits, self.needs
        short = [name for name, have, want in (("slots", lim.max_slots, need.slots),
                                               ("depth", lim.max_depth, need.depth),
                                               ("support", lim.max_support, need.support))
                 if have < want]
        ok = not short
        if ok and ev.version == WIRE_V2 and not self.pool.allocations:  # the first v2
            # session: the rows its limits allow, touched now (later sessions reuse them)
            self.pool.preallocate(ev.limits.dense_row_bytes, slot_rows(ev.limits))
        if short:
            # as a refused HELLO: each reconnection alike, a line per interval
            self.metrics.logs.log(log, logging.ERROR, ("limits_short",),
                                  "worker's limits too small for this verifier (%s); "
                                  "refusing the session", ", ".join(short))
            self.metrics.validation_failure(Reason.UNEXPECTED_SIZE)
            self.metrics.hello_refused(Reason.UNEXPECTED_SIZE)
            self.refused = Reason.UNEXPECTED_SIZE
            self._proto.transport.close()
        if self._started is not None and not self._started.done():
            self._started.set_result(ok)

    def _on_timeouts(self, failed: list[ProposalFailed]) -> None:
        self.metrics.watchdog_timeouts.inc(len(failed))
        self.on_events(failed)

    def _resolve(self, slot: int, outcome) -> None:
        if self._in_flight.resolve(slot, outcome):
            self._schedule_flush()  # a batch's place is free: the queued STEPs may leave

    # -- operations ----------------------------------------------------------------

    @property
    def max_context(self) -> int:
        """Negotiated bound on the committed context one slot may hold (0 when down)."""
        return self.endpoint.limits.max_context if self._ready else 0

    def send_context(self, slot: int, generation: int, prefix: Prefix, start: int) -> bool:
        """Give the worker ``prefix`` from position ``start`` on (0: all of it; else it
        holds the first ``start`` tokens). False when it could not be sent."""
        if not self._ready:
            return False
        msg = context_of(session=self.endpoint.session, slot=slot, generation=generation,
                         tokens=prefix.tokens[start:], start=start, digest=prefix.digest)
        if not self._send_control(msg):
            return False
        self.metrics.context_tokens.inc(msg.count)
        return True

    def circuit_open(self) -> bool:
        """The breaker lets no round speculate now: serve target-only, send nothing."""
        return self.circuit.blocks(asyncio.get_running_loop().time())

    def propose(self, step: Step) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if not self._ready:
            fut.set_result(Fallback(FallbackCause.WORKER_UNAVAILABLE, Reason.CONNECTION_LOST))
            return fut
        probe = self.circuit.permit(loop.time())
        if probe is None:  # another round took the probe meanwhile
            fut.set_result(Fallback(FallbackCause.CIRCUIT_OPEN, Reason.STEP_TIMEOUT,
                                    "circuit open"))
            return fut
        fut.add_done_callback(functools.partial(self.circuit.step_ended, probe))
        self._queued.append((step, fut))
        self._schedule_flush()
        return fut

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and (self._queued or self._controls):
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Write what this tick sent, in the order it was sent: the control frames (each
        encoded, so ordered, when sent), then the queued STEPs: one write, so the worker
        reads a round's COMMITs and the next round's STEPs in one wake-up."""
        self._flush_scheduled = False
        frames, self._controls = self._controls, []
        if not self._writable():
            return  # a closing transport: _go_down fails the queued STEPs
        if self._queued and self._in_flight.has_room:
            self._encode_steps(frames)
        if frames:
            self._proto.transport.write(b"".join(frames))

    def _encode_steps(self, frames: list) -> None:
        now = asyncio.get_running_loop().time()
        batch: dict[int, asyncio.Future] = {}
        for step, fut in self._queued:
            if fut.done():  # its request went away (cancelled) and was RESET: never send it
                continue
            try:
                frames.append(self.endpoint.send(step, now))
            except LocalProtocolError as e:  # a scheduler bug: fail closed, never send
                log.error("STEP not sent: %s", e)
                fut.set_result(Fallback(FallbackCause.WORKER_UNAVAILABLE, e.reason, e.detail))
                continue
            batch[step.slot] = fut
        self._queued.clear()
        self._in_flight.add(batch)
        self._watchdog.arm()

    def commit(self, commit: Commit) -> bool:
        return self._send_control(commit)

    def reset(self, slot: int, generation: int, reason: Reason) -> bool:
        """Invalidate ``generation`` (and older) of ``slot`` on the worker; False if down."""
        if not self._ready:
            return False
        sent = self._send_control(Reset(session=self.endpoint.session, slot=slot,
                                        generation=generation, reason=Reason(reason).value))
        if sent:  # the endpoint discards the slot's reply unread: no event would end its
            # STEP in flight, whose batch place a request cancelled mid-round (its client
            # left) then held for ever; two such, and no STEP left again
            self._resolve(slot, Fallback(FallbackCause.WORKER_UNAVAILABLE, Reason.CANCELLED,
                                         "reset while in flight"))
        return sent

    def _writable(self) -> bool:
        """Ready and the transport not closing: after a stream error closed it, the session
        stays ready until connection_lost runs, and a write then raises (uvloop); a session
        the worker refused (slot -1) is closed on the endpoint before the transport goes."""
        return (self._ready and not self._proto.transport.is_closing()
                and self.endpoint.state is Conn.READY)

    def _send_control(self, msg) -> bool:
        if not self._writable() or msg.session != self.endpoint.session:
            return False  # a message of a dead session: the new session knows nothing of it
        try:
            frame = self.endpoint.send(msg, asyncio.get_running_loop().time())
        except LocalProtocolError as e:
            log.error("%s not sent: %s", type(msg).__name__, e)
            return False
        self._controls.append(frame)
        self._schedule_flush()
        return True
