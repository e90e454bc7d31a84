"""Outcome enums: closed sets of what happened, used as Prometheus label values.

Errors carry a ``pp1q.core.errors.Reason``; these name outcomes that are not errors of
their own (a discarded round, a step's kind, a refused peer, a rank group failure).
Each value is a label value, so each set is closed and never holds ids or free text.
"""

from __future__ import annotations

import enum


class FallbackCause(enum.StrEnum):
    """Why a speculative round was discarded and replaced by one target-only step."""

    WATCHDOG_TIMEOUT = "watchdog_timeout"  # no validated COMPLETION before the STEP deadline
    INVALID_REPLY = "invalid_reply"  # a frame failed validation (reason in validation_failures)
    CONNECTION_LOST = "connection_lost"  # the worker connection dropped with the proposal open
    WORKER_UNAVAILABLE = "worker_unavailable"  # no live session to the worker at STEP time
    WORKER_REFUSED = "worker_refused"  # the worker answered the STEP with a refusal
    # the link's circuit breaker is open (consecutive watchdog timeouts): no STEP sent
    CIRCUIT_OPEN = "circuit_open"


class PeerRefusal(enum.StrEnum):
    """Why this daemon refused a peer before any session existed (closed set)."""

    TLS_HANDSHAKE = "tls_handshake"  # no certificate, untrusted CA, expired, wrong name, not TLS
    IDENTITY_MISMATCH = "identity_mismatch"  # HELLO identity differs from our configuration
    HELLO_INCOMPATIBLE = "hello_incompatible"  # no common wire version, or limits too small
    # sampled speculation offered to a side that did not enable it (--speculation)
    SPECULATION_NOT_ENABLED = "speculation_not_enabled"
    # worker: its HELLO names a session id live on another connection (pp1q.wire.sessions)
    SESSION_IN_USE = "session_in_use"
    TOO_MANY_SESSIONS = "too_many_sessions"  # worker: every session place held by a stepper


class StepKind(enum.StrEnum):
    """How the verifier produced tokens in one scheduling step of a request."""

    SPECULATIVE = "speculative"  # a verified v2 proposal
    GREEDY = "greedy"  # a v1 greedy (temperature 0) proposal
    TARGET_ONLY = "target_only"  # requested speculative=false
    FALLBACK = "fallback"  # target-only after a discarded proposal


class RankFailure(enum.StrEnum):
    """Why verifier ranks (``--ranks N``) could not act together (docs/operations.md)."""

    RANK_LOST = "rank_lost"  # a collective failed: a rank's connection closed (crash, network)
    RANK_TIMEOUT = "rank_timeout"  # a collective exceeded rank_timeout_s: a hung or stalled rank
    DIGEST_MISMATCH = "digest_mismatch"  # a rank's committed state differs from rank 0's
    RANK_REFUSED = "rank_refused"  # a rank voted no for another reason; every rank discarded


class PrefillOutcome(enum.StrEnum):
    """How a worker's prefill ahead of a slot's first STEP (a whole CONTEXT's) ended,
    once it ran a chunk, or failed (pp1q.worker.drafting; docs/operations.md)."""

    COMPLETED = "completed"  # every chunk of the context ran
    TAKEN_OVER = "taken_over"  # the slot's STEP came: its prepare goes on from there
    SUPERSEDED = "superseded"  # a new whole CONTEXT for the slot started its own prefill
    RESET = "reset"  # a RESET for the slot (the prefix is kept: its next STEP resumes)
    CLOSED = "closed"  # the connection ended (peer, idle or evicted session, stop)
    FAILED = "failed"  # the drafter raised (logged with its reason: draft_kv_budget, ...)
