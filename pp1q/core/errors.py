"""One exception hierarchy for pp1q, with machine-readable reasons.

Two protocol classes, as in h11: ``LocalProtocolError`` is our own misuse (a bug
on this side), ``RemoteProtocolError`` is something a peer sent. Every error
carries a ``reason`` from the closed ``Reason`` enum; reasons become Prometheus
label values, so the set is closed and never holds ids or free text.
"""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    # -- building a q row from logits (local inputs) --
    NAN_LOGIT = "nan_logit"
    POSINF_LOGIT = "posinf_logit"
    ZERO_MASS = "zero_mass"
    BAD_TEMPERATURE = "bad_temperature"
    BAD_TOP_K = "bad_top_k"
    BAD_TOP_P = "bad_top_p"  # target processor: top_p outside (0, 1]
    ALLOCATION_INCONSISTENT = "allocation_inconsistent"
    DRAW_OUT_OF_RANGE = "draw_out_of_range"
    RNG_KEY_OUT_OF_RANGE = "rng_key_out_of_range"
    # -- q rows received (seed's validation list) --
    MISSING_Q = "missing_q"
    NON_FINITE = "non_finite"
    NEGATIVE_VALUE = "negative_value"
    NON_DYADIC = "non_dyadic"
    WRONG_MASS = "wrong_mass"
    DUPLICATE_ID = "duplicate_id"
    UNSORTED_SUPPORT = "unsorted_support"
    NON_CANONICAL = "non_canonical"
    ID_OUT_OF_RANGE = "id_out_of_range"
    PADDING_NONZERO = "padding_nonzero"
    ZERO_Q_AT_TOKEN = "zero_q_at_token"
    UNEXPECTED_SIZE = "unexpected_size"
    # -- framing and messages --
    BAD_MAGIC = "bad_magic"
    BAD_VERSION = "bad_version"
    BAD_REVISION = "bad_revision"  # a peer (or capture) of another revision of wire v2
    UNKNOWN_MESSAGE_TYPE = "unknown_message_type"
    FRAME_TOO_LARGE = "frame_too_large"
    MALFORMED_CONTROL = "malformed_control"
    CHECKSUM_MISMATCH = "checksum_mismatch"
    SUPPORT_TOO_LARGE = "support_too_large"
    DEPTH_TOO_LARGE = "depth_too_large"
    SLOT_OUT_OF_RANGE = "slot_out_of_range"
    WRONG_IDENTITY = "wrong_identity"
    STALE_GENERATION = "stale_generation"
    DUPLICATE_ROUND = "duplicate_round"
    STATE_NOT_ALLOWED = "state_not_allowed"
    UNSUPPORTED_FEATURE = "unsupported_feature"
    PEER_REFUSED = "peer_refused"
    # the draft id is not what its own q and the proposal key give (q not the q that sampled)
    PROPOSAL_MISMATCH = "proposal_mismatch"
    # -- wire v2 sessions and endpoints --
    BAD_FLAGS = "bad_flags"
    BAD_POSITION = "bad_position"
    OUT_OF_ORDER = "out_of_order"
    SAMPLED_ON_V1 = "sampled_on_v1"
    # HELLO: the peer offered (or answered) sampled speculation this side did not enable
    SPECULATION_NOT_ENABLED = "speculation_not_enabled"
    TOO_MANY_INFLIGHT = "too_many_inflight"
    STEP_TIMEOUT = "step_timeout"
    WORKER_ABORTED = "worker_aborted"
    # the worker's drafter raised outside this set (a model's runtime error, say): the
    # step is aborted (an ABORTED COMPLETION names this), never left to the watchdog
    DRAFTER_FAILED = "drafter_failed"
    # the drafter's K/V would pass the worker's draft_kv_budget_bytes with nothing left to
    # drop (every other request mid-prefill or drafting): this request dropped, its STEP aborted
    DRAFT_KV_BUDGET = "draft_kv_budget"
    CONNECTION_LOST = "connection_lost"
    NO_CONTEXT = "no_context"  # a STEP for a slot whose committed context the worker lacks
    CONTEXT_TOO_LONG = "context_too_long"  # a context past the negotiated max_context tokens
    # a drafter/target pair whose token id maps (tokenizer digests) or widths differ
    TOKENIZER_MISMATCH = "tokenizer_mismatch"
    MODEL_MISSING = "model_missing"  # a model file (the embedded one, say) is not installed
    CANCELLED = "cancelled"  # RESET without a fault: request finished or cancelled by its user
    # -- the worker's bounds on its peers (pp1q.wire.sessions); each closes a connection --
    TOO_MANY_SESSIONS = "too_many_sessions"  # every session held by one that sent a STEP
    SESSION_IN_USE = "session_in_use"  # HELLO names a session id live on another connection
    HELLO_TIMEOUT = "hello_timeout"  # no HELLO within hello_timeout_s of the connect
    IDLE_TIMEOUT = "idle_timeout"  # a session that never sent a STEP, silent idle_timeout_s
    EVICTED = "evicted"  # a session that never sent a STEP, evicted for a newer HELLO
    NO_HELLO = "no_hello"  # the peer closed the connection before its HELLO was answered
    # -- the verifier's service (pp1q.verifier.http maps each to an HTTP status) --
    QUEUE_FULL = "queue_full"  # every slot taken and the wait queue at its bound
    RANKS_LOST = "ranks_lost"  # the verifier rank group failed (a rank died, hung, desynced)
    RANK_DISAGREEMENT = "rank_disagreement"  # a rank refused an op: nothing was committed
    GENERATIONS_EXHAUSTED = "generations_exhausted"  # a slot used all its 24-bit generations
    BAD_REQUEST = "bad_request"  # the HTTP layer refused a request (status and code say how)
    STOPPING = "stopping"  # the verifier is stopping (SIGTERM): queued and new requests refused
    # target processors a rank group cannot apply exactly (top-k/top-p across vocabulary
    # shards; anything but T = 1 on replicated ranks): 422, never sampled otherwise
    UNSUPPORTED_PROCESSORS = "unsupported_processors"
    # a request whose prompt and max_tokens pass the target's context (its
    # max_position_embeddings): 422 before it takes a slot
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    # the client's address holds its share of the slot queue (requests_queued_per_address)
    TOO_MANY_QUEUED_FROM_ADDRESS = "too_many_queued_from_address"
    # HTTP connections at their bound: one 503; worker: a newer wire connection took the
    # place of this one before its HELLO (pp1q.wire.sessions)
    TOO_MANY_CONNECTIONS = "too_many_connections"
    # HTTP: one client address at its share of the connections (pp1q.verifier.http_gate)
    TOO_MANY_CONNECTIONS_FROM_ADDRESS = "too_many_connections_from_address"
    # HTTP: a client read none of its response for write_stall_s; its connection aborted
    CLIENT_STALLED = "client_stalled"
    # HTTP: every connection held, and a client holding at least two fewer than this
    # one's address arrived: this one, taking its answer (or sending its request's body)
    # too slowly, gave its place up
    OVER_SHARE = "over_share"
    # HTTP: the same, but this one was idle, waiting for its client's next request:
    # closed with no answer lost
    IDLE_OVER_SHARE = "idle_over_share"
    # -- the HTTP client (pp1q.tools.client) --
    UNREACHABLE = "unreachable"  # no answer from the verifier's HTTP API
    BAD_RESPONSE = "bad_response"  # an answer that is not the API's JSON
    REQUEST_REFUSED = "request_refused"  # the API answered with an error (status and code)
    # -- files and rank groups --
    BAD_CAPTURE = "bad_capture"  # a capture file is corrupt, truncated or not a capture
    # -- daemon start-up --
    BAD_CONFIG = "bad_config"  # a setting (file or option) the operator must fix


class Pp1qError(Exception):
    """Base of every error pp1q raises on purpose."""

    def __init__(self, reason: Reason, detail: str = "", *, message: str | None = None) -> None:
        self.reason = Reason(reason)
        self.detail = detail
        if message is None:
            message = f"{self.reason.value}: {detail}" if detail else self.reason.value
        super().__init__(message)


class DistributionError(Pp1qError):
    """A q row cannot be built from these local inputs (bad logits, temperature...)."""


class LocalProtocolError(Pp1qError):
    """We tried to do something the protocol or the negotiated limits forbid."""


class RemoteProtocolError(Pp1qError):
    """The peer sent something invalid. Raised for every malformed input, and only that."""


class RowValidationError(RemoteProtocolError):
    """A received q row (dense or sparse wire form) is not a valid dyadic24 row."""


class ServiceError(Pp1qError):
    """The verifier cannot serve this request (queue full, rank group lost or in
    disagreement, generations exhausted). Raised by the scheduler and its deciders; only
    the HTTP layer turns the reason into a status (pp1q.verifier.http.STATUS_OF)."""


class ConfigError(Pp1qError):
    """A setting the operator must fix (file, option, or a resource it names, such as a
    port in use). The message is one line naming the key and the value; the daemons
    print it and exit with status 2 (their supervisors do not restart on 2).
    ``key``: the setting concerned, when there is one."""

    def __init__(self, detail: str, key: str | None = None) -> None:
        super().__init__(Reason.BAD_CONFIG, detail)
        self.key = key

    def __str__(self) -> str:
        return self.detail


# Other members of the set live beside their raisers, each a Pp1qError with a Reason:
# HttpError (pp1q.verifier.http), ApiError (pp1q.tools.client), CaptureError
# (pp1q.runtime.capture.reader), GroupError (pp1q.verifier.ranks.collective),
# GroupLostError and OpRefusedError (pp1q.verifier.ranks.group).
