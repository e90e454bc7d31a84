"""Prometheus metrics of the worker and verifier daemons.

Conventions (../shared/ANCHORS.md): one prefix ``pp1q_``, base units (seconds, bytes),
counters end in ``_total``, identity in ``pp1q_build_info``, and label values only from
closed sets: ``pp1q.core.errors.Reason`` for validation failures and the outcome enums of
``pp1q.core.outcomes`` (FallbackCause, StepKind, PeerRefusal, RankFailure, PrefillOutcome)
for the rest.
Each daemon owns a ``CollectorRegistry`` (never the process-global one), so tests can
run several daemons in one process; ``serve`` publishes it from a thread of its own
(pp1q.runtime.metrics_http), which keeps scrapes off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from pp1q import __version__
from pp1q.core.errors import Reason
from pp1q.core.outcomes import FallbackCause, PeerRefusal, PrefillOutcome, RankFailure, StepKind
from pp1q.runtime.log_limit import LogLimit
from pp1q.runtime.metrics_http import start_metrics_server
from pp1q.runtime.settings import DaemonSettings, cannot_listen
from pp1q.wire.events import DISCARD_REASONS
from pp1q.wire.sessions import CLOSE_REASONS

PREFIX = "pp1q"
MAX_DEPTH_BUCKET = 8  # accepted-length buckets 0..8 cover the fixed depth 5 with room
ROUND_LATENCY_BUCKETS = (  # seconds: loopback toy rounds are ms, dense 129280 rounds tens of ms
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# an idle heartbeat takes ~1 ms on loopback; rank_timeout_s (default 5 s) loses the group
RANK_EXCHANGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                         5.0)


# Which daemon exports each family (docs/operations.md, "Metrics", lists the same; a test
# compares both daemons' /metrics against it). A family of the other role is still
# created, unregistered, so shared code may touch it, but it is never exported.
VERIFIER, WORKER, BOTH = frozenset({"verifier"}), frozenset({"worker"}), frozenset(
    {"verifier", "worker"})
ROLES_OF: dict[str, frozenset[str]] = {
    "build": BOTH, "rounds": VERIFIER, "drafted_tokens": VERIFIER, "accepted_tokens": VERIFIER,
    "generated_tokens": VERIFIER, "accepted_length": VERIFIER, "round_latency_seconds": BOTH,
    "fallbacks": VERIFIER, "validation_failures": BOTH, "watchdog_timeouts": VERIFIER,
    "generation_invalidations": BOTH, "late_replies_discarded": VERIFIER,
    "proposals_streamed": VERIFIER,
    "reconnects": VERIFIER, "peers_refused": BOTH, "reply_bytes": BOTH, "requests": VERIFIER,
    "slots_in_use": BOTH, "rank_world_size": VERIFIER, "rank_failures": VERIFIER,
    "rank_exchanges": VERIFIER, "rank_decisions": VERIFIER, "rank_exchange_seconds": VERIFIER,
    "rank_kv_evictions": VERIFIER,
    "steps": WORKER, "context_tokens": VERIFIER, "speculation": BOTH,
    "circuit_trips": VERIFIER, "circuit_state": VERIFIER, "requests_refused": VERIFIER,
    "requests_queued": VERIFIER, "steps_in_flight": VERIFIER, "http_connections_aborted": VERIFIER,
    "metrics_connections_refused": BOTH, "metrics_connections_aborted": BOTH,
    "connections_closed": WORKER, "drafting_aborts": WORKER, "draft_kv_evictions": WORKER,
    "draft_prefill_tokens": WORKER, "draft_prefills": WORKER,
}
# Why the verifier refused a request before it took a slot (requests_refused's labels):
# 503 for the first five, 422 for processors a rank group cannot apply exactly and for a
# request past the target's context
REFUSED_REQUESTS = (Reason.QUEUE_FULL, Reason.STOPPING, Reason.TOO_MANY_CONNECTIONS,
                    Reason.TOO_MANY_CONNECTIONS_FROM_ADDRESS,
                    Reason.TOO_MANY_QUEUED_FROM_ADDRESS, Reason.UNSUPPORTED_PROCESSORS,
                    Reason.CONTEXT_LENGTH_EXCEEDED)
# Why the verifier aborted an HTTP connection it had admitted (http_connections_aborted)
ABORTED_CONNECTIONS = (Reason.CLIENT_STALLED, Reason.OVER_SHARE, Reason.IDLE_OVER_SHARE)


class Metrics:
    """Every pp1q metric; this daemon's role's families registered in its own registry."""

    def __init__(self, role: str, identity: dict[str, str] | None = None) -> None:
        self.role = role
        r = self.registry = CollectorRegistry(auto_describe=True)

        def reg(name: str) -> CollectorRegistry | None:
            return r if role in ROLES_OF[name] else None

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"{PREFIX}_{name}", doc, labels, registry=reg(name))

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"{PREFIX}_{name}", doc, registry=reg(name))

        self.info = Info(f"{PREFIX}_build", "Daemon identity: role, version, models, wire",
                         registry=reg("build"))
        self.info.info({"role": role, "version": __version__, **(identity or {})})
        self.speculation = Info(f"{PREFIX}_speculation",
                                "Speculation mode this daemon was configured with (mode: "
                                "off, greedy or sampled)", registry=reg("speculation"))
        # verifier: rounds and tokens
        self.rounds = counter("rounds", "Verification steps completed, by kind", ("kind",))
        self.drafted_tokens = counter("drafted_tokens", "Draft tokens received and verified")
        self.accepted_tokens = counter("accepted_tokens", "Draft tokens accepted")
        self.generated_tokens = counter("generated_tokens", "Tokens committed to requests")
        self.accepted_length = Histogram(
            f"{PREFIX}_accepted_length", "Accepted draft tokens per verified round",
            buckets=tuple(float(i) for i in range(MAX_DEPTH_BUCKET + 1)),
            registry=reg("accepted_length"))
        self.round_latency = Histogram(
            f"{PREFIX}_round_latency_seconds",
            "STEP sent to decision made (verifier) or STEP received to COMPLETION or "
            "PROPOSAL sent (worker)",
            buckets=ROUND_LATENCY_BUCKETS, registry=reg("round_latency_seconds"))
        self.fallbacks = counter("fallbacks", "Proposals discarded for a target-only step",
                                 ("cause",))
        self.validation_failures = counter(
            "validation_failures", "Frames or rows refused by validation", ("reason",))
        self.watchdog_timeouts = counter("watchdog_timeouts", "STEP deadlines that expired")
        self.generation_invalidations = counter(
            "generation_invalidations",
            "Generations invalidated after a discarded proposal (RESET sent or received; "
            "the RESET that releases a finished request's slot is not counted)")
        self.late_replies = counter(
            "late_replies_discarded", "Frames discarded unread, by reason: stale_generation "
            "(an invalidated generation), duplicate_round (a round already complete: a copy)",
            ("reason",))
        self.proposals_streamed = counter(
            "proposals_streamed", "Sampled sparse steps a worker answered row by row (REPLYs "
            "and a COMPLETION) although one PROPOSAL fits them: legal, ~2 x depth frames "
            "to check instead of one")
        self.reconnects = counter("reconnects", "Worker sessions re-established after a loss")
        self.peers_refused = counter(
            "peers_refused", "Peers this daemon refused before a session (TLS handshake or "
            "HELLO), by reason", ("reason",))
        self.reply_bytes = counter(
            "reply_bytes", "Wire bytes from worker to verifier (REPLY, COMPLETION, PROPOSAL,"
            " HELLO answer, refusals): sent (worker) or received (verifier)")
        self.context_tokens = counter(
            "context_tokens", "Committed-context token ids in CONTEXT frames: sent (verifier)."
            " A fallback sends its one token, a digest mismatch the whole prefix again")
        self.circuit_trips = counter(
            "circuit_trips", "Times the worker link's circuit breaker opened (consecutive "
            "watchdog timeouts, or a failed probe)")
        self.circuit_state = gauge(
            "circuit_state", "Worker link circuit breaker: 0 closed, 1 open, 2 half-open, "
            "3 probing")
        self.requests = counter("requests", "Generation requests finished, by outcome: ok, "
                                "error, left_queued (its client left before it took a slot)",
                                ("outcome",))
        self.requests_refused = counter(
            "requests_refused", "Requests refused before they took a slot, by reason: 503 "
            "queue_full, stopping, too_many_connections, too_many_connections_from_address, "
            "too_many_queued_from_address; "
            "422 unsupported_processors, context_length_exceeded", ("reason",))
        self.metrics_connections_refused = counter(
            "metrics_connections_refused", "Connections to /metrics answered 503 and closed:"
            " 64 were being served, or 8 from the client's address")
        self.metrics_connections_aborted = counter(
            "metrics_connections_aborted", "Connections to /metrics cut at their 10 s "
            "deadline: the client had not sent its whole request, or not taken its answer")
        self.http_connections_aborted = counter(
            "http_connections_aborted", "HTTP connections the verifier aborted, by reason: "
            "client_stalled (the client read none of its response for write_stall_s), "
            "over_share (every connection held: its address's place given to one holding "
            "fewer)",
            ("reason",))
        self.requests_queued = gauge("requests_queued", "Requests waiting for a slot")
        self.slots_in_use = gauge("slots_in_use", "Request slots currently held")
        self.steps_in_flight = gauge(
            "steps_in_flight", "STEPs sent to the worker whose outcome is not in yet (their "
            "places in the link's batches in flight; 0 when no round runs)")
        # verifier ranks (--ranks N)
        self.rank_world_size = gauge("rank_world_size",
                                     "Verifier ranks in this daemon's group (1: no group)")
        self.rank_world_size.set(1)
        self.rank_failures = counter("rank_failures", "Verifier rank failures, by cause",
                                     ("cause",))
        self.rank_exchanges = counter("rank_exchanges",
                                      "Exchanges among verifier ranks (op batches, heartbeats)")
        self.rank_decisions = counter("rank_decisions",
                                      "Rounds and target-only steps this rank decided")
        self.rank_kv_evictions = counter(
            "rank_kv_evictions", "Slot K/V caches a vocabulary-sharded rank of a real model "
            "dropped to stay under its memory budget (the slot's next round recomputes them)")
        self.rank_exchange_seconds = Histogram(
            f"{PREFIX}_rank_exchange_seconds",
            "One exchange among verifier ranks, timed on rank 0 (which starts it): every "
            "collective and the decisions made inside them",
            buckets=RANK_EXCHANGE_BUCKETS, registry=reg("rank_exchange_seconds"))
        # worker
        self.steps = counter("steps", "STEP messages accepted for drafting (worker)")
        self.connections_closed = counter(
            "connections_closed", "Connections that ended without a session, or whose session"
            " never sent a STEP, closed by the worker's bounds or by the peer, by reason",
            ("reason",))
        for reason in CLOSE_REASONS:
            self.connections_closed.labels(reason=reason.value)
        self.drafting_aborts = counter(
            "drafting_aborts", "STEPs the worker aborted while drafting (COMPLETION status"
            " ABORTED), by reason", ("reason",))
        self.draft_kv_evictions = counter(
            "draft_kv_evictions", "Drafter requests a real model's worker dropped (their "
            "K/V) to stay under draft_kv_budget_bytes or 256 requests: their next STEP "
            "prefills again")
        self.draft_prefill_tokens = counter(
            "draft_prefill_tokens", "Prompt ids the worker's drafter prefilled (the ids of "
            "each chunk handed to it: ahead of a STEP on a whole CONTEXT, or in a STEP's "
            "prepare); a drafter without prefill (the toy chain) counts none")
        self.draft_prefills = counter(
            "draft_prefills", "Prefills a whole CONTEXT started ahead of the slot's first "
            "STEP, counted once they ran a chunk (or failed), by how they ended: completed, "
            "taken_over (the STEP came), superseded (a new whole CONTEXT), reset, closed "
            "(the connection ended), failed", ("outcome",))
        for cause in FallbackCause:  # expose zeros: a scrape shows every cause
            self.fallbacks.labels(cause=cause.value)
        for outcome in PrefillOutcome:
            self.draft_prefills.labels(outcome=outcome.value)
        for kind in StepKind:
            self.rounds.labels(kind=kind.value)
        for failure in RankFailure:
            self.rank_failures.labels(cause=failure.value)
        for refusal in PeerRefusal:
            self.peers_refused.labels(reason=refusal.value)
        for reason in REFUSED_REQUESTS:
            self.requests_refused.labels(reason=reason.value)
        for reason in ABORTED_CONNECTIONS:
            self.http_connections_aborted.labels(reason=reason.value)
        for reason in DISCARD_REASONS:
            self.late_replies.labels(reason=reason.value)
        # the human's summary of the events counted here: one line per kind per interval,
        # whatever a peer or client does (its counters stay exact)
        self.logs = LogLimit()

    def validation_failure(self, reason: Reason) -> None:
        self.validation_failures.labels(reason=Reason(reason).value).inc()

    def peer_refused(self, reason: PeerRefusal) -> None:
        self.peers_refused.labels(reason=PeerRefusal(reason).value).inc()

    def hello_refused(self, reason: Reason) -> None:
        """We refused the peer's HELLO (or its answer) for ``reason``."""
        self.peer_refused({Reason.WRONG_IDENTITY: PeerRefusal.IDENTITY_MISMATCH,
                           Reason.SPECULATION_NOT_ENABLED: PeerRefusal.SPECULATION_NOT_ENABLED,
                           Reason.SESSION_IN_USE: PeerRefusal.SESSION_IN_USE,
                           Reason.TOO_MANY_SESSIONS: PeerRefusal.TOO_MANY_SESSIONS,
                           }.get(reason, PeerRefusal.HELLO_INCOMPATIBLE))

    def request_refused(self, reason: Reason) -> None:
        self.requests_refused.labels(reason=Reason(reason).value).inc()

    def http_connection_aborted(self, reason: Reason) -> None:
        self.http_connections_aborted.labels(reason=Reason(reason).value).inc()

    def connection_closed(self, reason: Reason) -> None:
        self.connections_closed.labels(reason=Reason(reason).value).inc()

    def late_reply(self, reason: Reason) -> None:
        """A frame the endpoint discarded unread (``Discarded``), for ``reason``."""
        self.late_replies.labels(reason=Reason(reason).value).inc()

    def prefill_ended(self, outcome: PrefillOutcome) -> None:
        """A prefill ahead of a STEP that ran a chunk (or failed) ended
        (``draft_prefills``)."""
        self.draft_prefills.labels(outcome=PrefillOutcome(outcome).value).inc()

    def fallback(self, cause: FallbackCause) -> None:
        self.fallbacks.labels(cause=FallbackCause(cause).value).inc()

    def serve(self, host: str, port: int):
        """Serve /metrics from a thread; returns the WSGI server (``.server_port``)."""
        return start_metrics_server(self.registry, host, port,
                                    on_refused=self.metrics_connections_refused.inc,
                                    on_aborted=self.metrics_connections_aborted.inc)

    @contextlib.contextmanager
    def served(self, host: str, port: int | None):
        """Serve /metrics while the block runs (``port`` None: not at all); yields the
        bound port (``port`` 0 picks a free one) or None. A port that cannot be bound (in
        use, say) is a settings error."""
        if port is None:
            yield None
            return
        try:
            server = self.serve(host, port)
        except OSError as e:
            raise cannot_listen("metrics_port", f"{host}:{port}", e) from None
        try:
            yield server.server_port
        finally:
            server.shutdown()
            server.server_close()

    def value(self, name: str, **labels: str) -> float:
        """Current value of one sample (tests and summaries)."""
        v = self.registry.get_sample_value(name, labels or None)
        return 0.0 if v is None else float(v)


async def serve_until_stopped(metrics: Metrics, settings: DaemonSettings, banner: str, port: int,
                              stop: asyncio.Event, ready=None, draining=None) -> None:
    """A daemon's main wait: /metrics up, one banner line naming the ports on stdout
    (pp1q.runtime.launcher reads it), ``ready(port, metrics_port)``, then wait for ``stop``;
    ``draining()``: awaited after ``stop``, /metrics still up (the verifier's drain)."""
    host = settings.metrics_host
    with metrics.served(host, settings.metrics_port) as mport:
        print(banner + (f", metrics on {host}:{mport}" if mport else ""), flush=True)
        if ready is not None:
            ready(port, mport)
        await stop.wait()
        if draining is not None:
            await draining()
