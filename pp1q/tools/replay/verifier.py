"""Replaying a capture against a fresh, in-memory ``VerifierEndpoint``.

The endpoint is built from the captured HELLO (identity, limits, versions, session).
Frames the verifier sent drive its state through ``send()``, and each must re-encode
to the captured bytes exactly; the worker's bytes go through ``receive_data()`` in the
chunks they were recorded in. The events (ProposalReady, ProposalFailed with its
reason, Discarded) and the COMMITs the endpoint accepted make the report. A captured
frame this endpoint refuses, or re-encodes differently, is a divergence: a capture
that replays with none is one this pp1q's wire code would have produced and accepted.

Watchdog: a STEP's deadline is not on the wire; with ``step_timeout`` (argument, or
``step_timeout_s`` from the capture's INFO) ``check_timeouts`` runs at every record's
timestamp, so a captured timeout replays as ProposalFailed(step_timeout).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pp1q.core.errors import LocalProtocolError, Reason, RemoteProtocolError
from pp1q.runtime.capture import CaptureError, CaptureReader, Kind, Protocol, Record
from pp1q.tools.replay.reverify import DRAW_KEY_INFO, Reverifier, draws_for
from pp1q.tools.replay.streams import Flow, StreamSet, flow_of
from pp1q.wire import WIRE_REVISION, Commit, Context, Hello, VerifierEndpoint, WireConfig
from pp1q.wire.events import ProposalFailed, ProposalReady
from pp1q.wire.messages import type_of
from pp1q.wire.table import Conn

NO_TIMEOUT_S = 1e12  # deadlines that never fire when the capture does not state one


@dataclass(frozen=True)
class CommitRecord:
    time_ns: int
    conn: int
    session: int
    slot: int
    generation: int
    round_id: int
    accepted: int
    token: int
    committed: int

    def as_json(self) -> dict:
        return {k: getattr(self, k) for k in ("slot", "generation", "round_id", "accepted",
                                              "token", "committed")}


@dataclass(frozen=True)
class Divergence:
    time_ns: int
    conn: int
    what: str
    reason: Reason | None = None


@dataclass(frozen=True)
class Happened:
    """An endpoint event with when and where it happened."""

    time_ns: int
    conn: int
    event: object


@dataclass
class ReplayReport:
    events: list[Happened] = field(default_factory=list)
    commits: list[CommitRecord] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    stream_errors: list[Happened] = field(default_factory=list)  # RemoteProtocolError
    rechecked: int = 0  # commits re-decided from the target (with a Reverifier)
    not_rechecked: int = 0  # validated rounds without a known prefix (CONTEXT not captured)
    start_ns: int | None = None  # time of the capture's first record

    @property
    def ok(self) -> bool:
        return not self.divergences

    @property
    def failures(self) -> list[ProposalFailed]:
        return [h.event for h in self.events if isinstance(h.event, ProposalFailed)]

    @property
    def ready(self) -> list[ProposalReady]:
        return [h.event for h in self.events if isinstance(h.event, ProposalReady)]


class _Conn:
    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.endpoint: VerifierEndpoint | None = None


class VerifierReplay:
    def __init__(self, role, *, step_timeout: float | None = None,
                 reverifier: Reverifier | None = None) -> None:
        self.role = role
        self.step_timeout = step_timeout
        self.reverifier = reverifier
        self.report = ReplayReport()
        self._streams = StreamSet(role)
        self._conns: dict[int, _Conn] = {}

    def run(self, records) -> ReplayReport:
        for rec in records:
            self.feed(rec)
        if self.reverifier is not None:
            self.report.rechecked = self.reverifier.checked
            self.report.not_rechecked = self.reverifier.skipped
        return self.report

    def feed(self, rec: Record) -> None:
        t = rec.time_ns
        if self.report.start_ns is None:
            self.report.start_ns = t
        if rec.kind is Kind.INFO:
            if self.step_timeout is None and "step_timeout_s" in rec.meta:
                self.step_timeout = _step_timeout(rec)
            return
        if rec.kind is Kind.OPEN:
            self._conns[rec.conn] = _Conn(str(rec.meta.get("protocol", "")))
            self._streams.items(rec)
            return
        c = self._conns[rec.conn]
        ep = c.endpoint
        self._watchdog(rec.conn, c, t)
        if rec.kind is Kind.CLOSE:
            if ep is not None and ep.state is not Conn.CLOSED:
                self._events(rec.conn, t, ep.close(Reason.CONNECTION_LOST))
            self._streams.items(rec)
            del self._conns[rec.conn]  # nothing follows on it (the reader checks)
            return
        flow = flow_of(self.role, rec.direction)
        if c.protocol == Protocol.WIRE and flow is Flow.TO_VERIFIER:
            self._receive(rec.conn, c, t, rec.body)
            return
        for item in self._streams.items(rec):
            if item.what == "error":
                self._diverge(t, rec.conn, f"verifier's {c.protocol} stream does not decode: "
                              f"{item.error}", item.error.reason)
            elif item.what == "frame":
                self._send(rec.conn, c, t, item.message, item.raw)

    # -- verifier -> worker: drive the endpoint's state ---------------------------

    def _send(self, conn: int, c: _Conn, t: int, msg, raw: bytes) -> None:
        kind = type_of(msg).name
        try:
            if isinstance(msg, Hello) and msg.revision != WIRE_REVISION:
                raise LocalProtocolError(Reason.BAD_REVISION,
                                         f"HELLO of wire v2 revision {msg.revision}")
            if isinstance(msg, Hello):
                c.endpoint = _endpoint_for(msg, self.step_timeout)
                frame = c.endpoint.hello()
            elif c.endpoint is None:
                raise LocalProtocolError(Reason.STATE_NOT_ALLOWED, "no HELLO before it")
            else:
                frame = c.endpoint.send(msg, t / 1e9)
        except LocalProtocolError as e:
            self._diverge(t, conn, f"captured {kind} refused by the replay endpoint: {e}",
                          e.reason)
            return
        if frame != raw:
            self._diverge(t, conn, f"{kind} re-encodes to different bytes (a wire change)")
        if isinstance(msg, Commit):
            self._commit(conn, t, msg)
        elif isinstance(msg, Context) and self.reverifier is not None:
            self.reverifier.on_context(msg.session, msg.slot, msg.start, msg.tokens)

    def _commit(self, conn: int, t: int, m: Commit) -> None:
        self.report.commits.append(CommitRecord(t, conn, m.session, m.slot, m.generation,
                                                m.round_id, m.accepted, m.token, m.committed))
        if self.reverifier is None:
            return
        check = self.reverifier.on_commit(m)
        if check is not None and check.problem:
            self._diverge(t, conn, f"COMMIT s{m.slot} g{m.generation} r{m.round_id}: "
                          f"{check.problem}")

    # -- worker -> verifier: the endpoint validates every byte ----------------------

    def _receive(self, conn: int, c: _Conn, t: int, data: bytes) -> None:
        ep = c.endpoint
        if ep is None or ep.state in (Conn.ERROR, Conn.CLOSED):
            return  # the live verifier had dropped this stream too
        try:
            events = ep.receive_data(data, t / 1e9)
        except RemoteProtocolError as e:
            self.report.stream_errors.append(Happened(t, conn, e))
            self._events(conn, t, ep.close(e.reason))
            return
        self._events(conn, t, events)

    def _watchdog(self, conn: int, c: _Conn, t: int) -> None:
        ep = c.endpoint
        if self.step_timeout is not None and ep is not None and ep.state is Conn.READY:
            self._events(conn, t, ep.check_timeouts(t / 1e9))

    def _events(self, conn: int, t: int, events) -> None:
        ep = self._conns[conn].endpoint
        for ev in events:
            self.report.events.append(Happened(t, conn, ev))
            if isinstance(ev, ProposalReady) and self.reverifier is not None:
                step = ep.slots[ev.slot].step
                problem = self.reverifier.on_ready(ep.session, step, ev)
                if problem:
                    self._diverge(t, conn, f"round s{ev.slot} g{ev.generation} "
                                  f"r{ev.round_id}: {problem}")

    def _diverge(self, t: int, conn: int, what: str, reason: Reason | None = None) -> None:
        self.report.divergences.append(Divergence(t, conn, what, reason))


def _step_timeout(rec: Record) -> float:
    """INFO's ``step_timeout_s``: a positive, finite number of seconds, or the capture is
    refused (a crafted one gave a ValueError traceback)."""
    value = rec.meta["step_timeout_s"]
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 < value < math.inf):
        raise CaptureError(f"INFO step_timeout_s {value!r}: not a positive number of "
                           f"seconds", rec.offset, rec.index)
    return float(value)


def _endpoint_for(hello: Hello, step_timeout: float | None) -> VerifierEndpoint:
    config = WireConfig(identity=hello.identity, limits=hello.limits,
                        versions=tuple(hello.versions))
    return VerifierEndpoint(config, session=hello.session,
                            step_timeout=NO_TIMEOUT_S if step_timeout is None else step_timeout)


def replay_verifier(path, *, step_timeout: float | None = None, target=None,
                    allow_truncated: bool = False, draws=None) -> ReplayReport:
    """Replay a capture file against in-memory verifier endpoints.

    ``target``: a TargetModel to re-decide every validated round with (None: the
    endpoint's checks and the captured COMMITs only); ``draws``: the verifier's draw
    secret (pp1q.core.drawkey.DrawKeys) when the capture names one.
    """
    reader = CaptureReader(path, allow_truncated=allow_truncated)
    reverifier = None
    if target is not None:
        reverifier = Reverifier(target, draws_for(draw_key_info(reader), draws))
    return VerifierReplay(reader.header.role, step_timeout=step_timeout,
                          reverifier=reverifier).run(reader)


def draw_key_info(records) -> dict | None:
    """The capture's ``draw_key`` INFO entry (None when it has none)."""
    for rec in records:
        if rec.kind is Kind.INFO and isinstance(rec.meta.get(DRAW_KEY_INFO), dict):
            return rec.meta[DRAW_KEY_INFO]
    return None


__all__ = ["CommitRecord", "Divergence", "Happened", "ReplayReport", "VerifierReplay",
           "draw_key_info", "replay_verifier"]
