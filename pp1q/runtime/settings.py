"""Typed daemon settings: one msgspec Struct per role, every default and every range
stated once, here.

``WorkerSettings`` and ``VerifierSettings`` share ``DaemonSettings`` (model identity,
metrics, logging, capture, mutual TLS). A field's name is its TOML key and, with ``-``
for ``_``, its command-line option (pp1q.runtime.config maps both onto these structs).
A settings object is checked whenever one is made (``__post_init__``: the constructor,
``msgspec.convert``, ``msgspec.structs.replace``), so a daemon never holds one that is
out of range: every float finite (NaN and infinities refused), every port 0..65535,
every address ``HOST:PORT``. A refusal is a ``ConfigError`` naming the key and value.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Annotated, Literal

import msgspec
from msgspec import Meta
from msgspec import inspect as mi

from pp1q.core.errors import ConfigError
from pp1q.models.serving import early_exit_depth
from pp1q.models.toy import (
    DEFAULT_DRAFT_PRESET,
    DEFAULT_VOCAB,
    DRAFT_PRESETS,
    MAX_VOCAB,
    MIN_VOCAB,
)
from pp1q.wire import WIRE_V1, WIRE_V2
from pp1q.wire.session_config import DEFAULT_MAX_SUPPORT
from pp1q.wire.sessions import (
    DEFAULT_HELLO_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_PENDING_SESSIONS,
    DEFAULT_MAX_SESSIONS,
    PeerBounds,
)

MAX_SLOTS = 64  # the scheduler preallocates target rows per slot; bound that memory
MAX_DEPTH = 16  # the design fixes depth 5; a larger value is an experiment, bounded
MAX_CONNECTIONS = 16384  # file descriptors; each connection costs ~70 KiB before HELLO
# the verifier's HTTP connections (pp1q.verifier.http_gate); more are answered 503 and
# closed. Bounds file descriptors and the requests parsed at once (with their bodies:
# pp1q.verifier.server.MAX_BODY_BYTES each)
MAX_HTTP_CONNECTIONS = 512
# one client address's share of them (an IPv6 client's: its /64's): half, so that one
# client cannot take every connection from the others while a load generator on one
# machine (200 concurrent clients is common) still gets its share; behind a proxy every
# client has the proxy's address: MAX_HTTP_CONNECTIONS, or 0 for no per-address bound
DEFAULT_HTTP_CONNECTIONS_PER_ADDRESS = 256
# requests waiting for a slot before new ones get 503: as many as the HTTP connections,
# since a queued request holds one (the connection bounds bind first)
MAX_QUEUED_REQUESTS = MAX_HTTP_CONNECTIONS
# one client address's share of that queue: half, as for the connections, so that one
# client's backlog leaves room for everyone else's requests while a load generator on
# one machine (200 concurrent clients) is still served; behind a proxy every client has
# the proxy's address: MAX_QUEUED_REQUESTS, or 0 for no per-address bound
DEFAULT_QUEUED_PER_ADDRESS = DEFAULT_HTTP_CONNECTIONS_PER_ADDRESS
# STEP deadlines when watchdog_ms is unset. The toy drafts a round in milliseconds; a
# real model's STEP on a CPU holds D drafter forwards and, on a new context, the
# drafter's prefill of the whole prompt: 1-3 s for SmolLM2-135M on one loaded core,
# measured past 2 s (watchdog_timeout fallbacks; BENCHMARKS.md, Real model).
TOY_WATCHDOG_MS = 2000
REAL_MODEL_WATCHDOG_MS = 20000
# a --shard-vocab rank's K/V for all its slots (pp1q.models.hf_shard); past it the least
# recently used slot caches are dropped and recomputed
DEFAULT_SHARD_KV_BUDGET = 8 << 30  # 64 slots x 2800 tokens of SmolLM2-135M at 46 KB a token
MIN_SHARD_KV_BUDGET = 1 << 20  # under ~20 tokens of that model: every round would recompute
MAX_SHARD_KV_BUDGET = 1 << 40  # 1 TiB, above any one rank's memory: a typo, not a plan
# the worker's drafter K/V for all its requests (pp1q.worker.engine_proposer); past it the
# least recently used are dropped (their next STEP prefills again), and a prefill that
# would pass it with nothing left to drop is refused (the STEP falls back, counted)
DEFAULT_DRAFT_KV_BUDGET = 8 << 30  # ~200,000 tokens of SmolLM2-135M's exit at 28 layers
MIN_DRAFT_KV_BUDGET = 1 << 20  # under ~25 tokens of that drafter: no prompt would fit
MAX_DRAFT_KV_BUDGET = 1 << 40  # 1 TiB, above any one worker's memory: a typo, not a plan
MIN_CAPTURE_BYTES = 1 << 20  # under it a capture holds a few dense frames: a typo, not a cap
MAX_CAPTURE_BYTES = 1 << 50  # 1 PiB, above any disk: a typo, not a plan
MAX_RANKS = 16  # vote rows grow with ranks; a tensor-parallel group is one or two nodes' GPUs
LOG_LEVELS = ("debug", "info", "warning", "error")
# off: target-only; greedy: v1 (temperature 0) speculation; sampled: v2 with exact q.
# Sampled runs only where both daemons name it (the design: no auto-upgrade).
SPECULATION_MODES = ("off", "greedy", "sampled")
DEFAULT_SPECULATION = "greedy"
RANK_BACKENDS = ("auto", "gloo", "nccl")

# -- value kinds (a float field is always finite as well) --
Address = Annotated[str, Meta(extra={"form": "address"})]  # HOST:PORT or [IPv6]:PORT
Draft = Annotated[str, Meta(extra={"form": "draft"})]  # early-exit:K
Port = Annotated[int, Meta(ge=0, le=65535)]
Positive = Annotated[float, Meta(gt=0)]
NonNegative = Annotated[float, Meta(ge=0)]
LogLevel = Literal[LOG_LEVELS]
DraftPreset = Literal[tuple(DRAFT_PRESETS)]
RankBackend = Literal[RANK_BACKENDS]
Speculation = Literal[SPECULATION_MODES]
TLS_FILES = ("tls_cert", "tls_key", "tls_ca")


class _Checked(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    def __post_init__(self) -> None:
        for key, _node, _default in fields(type(self)):
            check_value(type(self), key, getattr(self, key))
        given = [k for k in TLS_FILES if getattr(self, k)]
        if given and len(given) != len(TLS_FILES):
            missing = [k for k in TLS_FILES if k not in given]
            raise ConfigError(f"mutual TLS needs tls_cert, tls_key and tls_ca; missing "
                              f"{', '.join(missing)}", key=missing[0])


class DaemonSettings(_Checked, frozen=True, kw_only=True):
    """Keys both daemons take (top level of the TOML file, or either table)."""

    metrics_host: str = "127.0.0.1"
    metrics_port: Port | None = None  # None: /metrics not served; 0: any free port
    # toy: the seeded toy pair (no optional install, starts at once; every test's
    # default); embedded: the shipped SmolLM2-135M; else a local checkpoint path
    model: str = "toy"
    # real models: the drafter is the first K layers; 28 of SmolLM2's 30 accepts the
    # most drafts per round (BENCHMARKS.md, Real model: k = 8..24 accept few)
    draft: Draft = "early-exit:28"
    # real models, early exit: auto (the shipped map for this checkpoint and K, if any),
    # none, or an adapter file (pp1q train-adapter); both daemons name it in HELLO
    draft_adapter: str = "auto"
    draft_model: str | None = None  # real models: a second checkpoint drafts instead
    device: str = "cpu"  # real models: torch device (cpu, cuda, cuda:1, ...)
    dtype: Literal["float32", "bfloat16"] = "float32"  # real models: weights and compute
    gguf_cache: str | None = None  # real models: keep a GGUF de-quantized here (fast loads)
    vocab: Annotated[int, Meta(ge=MIN_VOCAB, le=MAX_VOCAB)] = DEFAULT_VOCAB
    model_seed: Annotated[int, Meta(ge=0, le=(1 << 63) - 1)] = 0
    capture: str | None = None  # FILE: record every frame (pp1q.runtime.capture)
    # the capture file's cap: at it recording stops, marked {"stopped": "max_bytes"} (a
    # dense round is ~10 MB); unset: no cap
    capture_max_bytes: Annotated[int, Meta(ge=MIN_CAPTURE_BYTES,
                                           le=MAX_CAPTURE_BYTES)] | None = None
    log_level: LogLevel = "info"
    tls_cert: str | None = None  # mutual TLS: all three files or none (pp1q.runtime.tls)
    tls_key: str | None = None
    tls_ca: str | None = None
    speculation: Speculation = DEFAULT_SPECULATION  # both daemons must name "sampled"


class WorkerSettings(DaemonSettings, frozen=True, kw_only=True):
    """``pp1q worker``."""

    listen: Address = "127.0.0.1:7070"
    draft_preset: DraftPreset = DEFAULT_DRAFT_PRESET
    draft_distance: Annotated[float, Meta(ge=0, le=1)] | None = None  # None: the preset's
    max_support: Annotated[int, Meta(ge=1, le=MAX_VOCAB)] = DEFAULT_MAX_SUPPORT
    # the verifier makes every row check again (pp1q.wire.validate: check_reply,
    # check_proposal): on, a worker bug is named on the worker (drafting_aborts) at one
    # more check per REPLY or PROPOSAL
    check_outgoing: bool = False
    # bounds on what any peer may hold (pp1q.wire.sessions; docs/operations.md, "Bounds
    # on the worker"): max_pending_sessions <= max_sessions < max_connections
    max_connections: Annotated[int, Meta(ge=2, le=MAX_CONNECTIONS)] = DEFAULT_MAX_CONNECTIONS
    max_sessions: Annotated[int, Meta(ge=1, le=MAX_CONNECTIONS - 1)] = DEFAULT_MAX_SESSIONS
    max_pending_sessions: Annotated[int, Meta(ge=1, le=MAX_CONNECTIONS - 1)] = (
        DEFAULT_MAX_PENDING_SESSIONS)
    hello_timeout_s: Positive = DEFAULT_HELLO_TIMEOUT_S
    idle_timeout_s: Positive = DEFAULT_IDLE_TIMEOUT_S
    draft_kv_budget_bytes: Annotated[int, Meta(ge=MIN_DRAFT_KV_BUDGET,
                                               le=MAX_DRAFT_KV_BUDGET)] = DEFAULT_DRAFT_KV_BUDGET

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_sessions >= self.max_connections:
            raise refusal("max_sessions", self.max_sessions,
                          f"must be below max_connections ({self.max_connections}): a new"
                          " connection needs room to say HELLO")
        if self.max_pending_sessions > self.max_sessions:
            raise refusal("max_pending_sessions", self.max_pending_sessions,
                          f"must be at most max_sessions ({self.max_sessions})")

    @property
    def peer_bounds(self) -> PeerBounds:
        return PeerBounds(self.max_connections, self.max_sessions, self.max_pending_sessions,
                          self.hello_timeout_s, self.idle_timeout_s)

    @property
    def versions(self) -> tuple[int, ...]:
        """Wire versions this worker accepts: sampled serves v2 sessions (which carry
        greedy requests too) and v1 ones; greedy only v1; off none (every HELLO refused)."""
        return {"sampled": (WIRE_V2, WIRE_V1), "greedy": (WIRE_V1,), "off": ()}[
            self.speculation]


class VerifierSettings(DaemonSettings, frozen=True, kw_only=True):
    """``pp1q verifier`` (every rank of a group)."""

    worker: Address = "127.0.0.1:7070"
    http: Address = "127.0.0.1:8080"
    draw_secret_file: str | None = None  # None: a random secret per start (pp1q.core.drawkey)
    slots: Annotated[int, Meta(ge=1, le=MAX_SLOTS)] = 4
    depth: Annotated[int, Meta(ge=1, le=MAX_DEPTH)] = 5
    top_k: Annotated[int, Meta(ge=0, le=DEFAULT_MAX_SUPPORT)] = 32  # 0: dense
    watchdog_ms: Annotated[int, Meta(gt=0)] | None = None  # None: by model (step_timeout_s)
    reconnect_max_s: Positive = 5.0
    # circuit breaker (pp1q.verifier.breaker): after this many consecutive watchdog
    # fallbacks no STEP is sent for breaker_open_s, doubling per failed probe to the max
    breaker_after_timeouts: Annotated[int, Meta(ge=1, le=1_000_000)] = 8
    breaker_open_s: Positive = 5.0
    breaker_open_max_s: Positive = 60.0
    # SIGTERM: in-flight requests may finish within this, queued ones are answered 503
    drain_timeout_s: NonNegative = 30.0
    # one client address's share of the HTTP connections (pp1q.verifier.http_gate); 0: no
    # such bound, for a proxy in front (every client then has the proxy's address)
    http_connections_per_address: Annotated[int, Meta(ge=0, le=MAX_HTTP_CONNECTIONS)] = \
        DEFAULT_HTTP_CONNECTIONS_PER_ADDRESS
    # one client address's share of the requests queued for a slot (pp1q.verifier.
    # slot_pool); 0: no such bound, for a proxy in front
    requests_queued_per_address: Annotated[int, Meta(ge=0, le=MAX_QUEUED_REQUESTS)] = \
        DEFAULT_QUEUED_PER_ADDRESS
    target_delay_ms: NonNegative = 0.0
    tls_server_name: str | None = None  # None: the host of ``worker``
    ranks: Annotated[int, Meta(ge=1, le=MAX_RANKS)] = 1
    rank: Annotated[int, Meta(ge=0, lt=MAX_RANKS)] | None = None  # None: spawn or torchrun
    rank_master: Address = "127.0.0.1:0"
    rank_backend: RankBackend = "auto"
    rank_timeout_s: Positive = 5.0
    rank_join_timeout_s: Positive = 120.0
    rank_exit_grace_s: NonNegative = 2.0
    shard_vocab: bool = False  # ranks hold vocabulary shards (pp1q.verifier.ranks.sharded)
    shard_kv_budget_bytes: Annotated[int, Meta(ge=MIN_SHARD_KV_BUDGET,
                                               le=MAX_SHARD_KV_BUDGET)] = DEFAULT_SHARD_KV_BUDGET

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shard_vocab and self.ranks < 2:
            raise ConfigError("shard_vocab needs ranks >= 2 (one rank holds the whole "
                              "vocabulary)", key="shard_vocab")
        if self.shard_vocab and self.vocab < self.ranks:
            raise ConfigError(f"shard_vocab: {self.ranks} ranks need a vocab of at least "
                              f"{self.ranks} ids", key="shard_vocab")
        if self.breaker_open_max_s < self.breaker_open_s:
            raise refusal("breaker_open_max_s", self.breaker_open_max_s,
                          f"must be >= breaker_open_s ({self.breaker_open_s:g})")

    @property
    def step_timeout_s(self) -> float:
        """The STEP watchdog: ``watchdog_ms``, or when unset TOY_WATCHDOG_MS for the toy
        and REAL_MODEL_WATCHDOG_MS for a real model."""
        if self.watchdog_ms is not None:
            return self.watchdog_ms / 1000.0
        return (TOY_WATCHDOG_MS if self.model == "toy" else REAL_MODEL_WATCHDOG_MS) / 1000.0

    @property
    def versions(self) -> tuple[int, ...]:
        """The one wire version this verifier offers: v2 for sampled, v1 for greedy, none
        for off (no worker link). Never a fallback list: a sampled verifier meeting a
        worker that did not enable sampled is refused at HELLO, not downgraded."""
        return {"sampled": (WIRE_V2,), "greedy": (WIRE_V1,), "off": ()}[self.speculation]


ROLES: dict[str, type[DaemonSettings]] = {"worker": WorkerSettings,
                                          "verifier": VerifierSettings}


@functools.cache
def fields(cls: type[_Checked]) -> tuple[tuple[str, object, object], ...]:
    """(key, msgspec.inspect type, default) of every setting of ``cls``, in order."""
    return tuple((f.name, f.type, f.default) for f in mi.type_info(cls).fields)


@functools.cache
def kind_of(cls: type[_Checked], key: str):
    for name, node, _default in fields(cls):
        if name == key:
            return node
    raise KeyError(key)


def default_of(cls: type[_Checked], key: str):
    return next(d for name, _node, d in fields(cls) if name == key)


def parse_hostport(text: str, what: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port)."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} {text!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def check_value(cls: type[_Checked], key: str, value, source: str | None = None):
    """``value`` for ``key`` (ints widened to float where a float is due), or a
    ConfigError naming key, value and ``source`` (a file and scope, or an option)."""
    node = kind_of(cls, key)
    if isinstance(value, int) and not isinstance(value, bool) and _wants_float(node):
        value = float(value)
    if not _accepts(node, value):
        raise refusal(key, value, f"must be {describe(node)}", source)
    return value


def from_option(cls: type[_Checked], key: str, value, source: str):
    """A command-line option's text (argparse keeps it a string) as ``key``'s value."""
    node = _bare(kind_of(cls, key))
    if isinstance(value, str):
        numbers = node.values if isinstance(node, mi.LiteralType) else ()
        try:
            if isinstance(node, mi.IntType) or any(isinstance(v, int) for v in numbers):
                value = int(value)
            elif isinstance(node, mi.FloatType):
                value = float(value)
        except ValueError:
            raise refusal(key, value, f"must be {describe(kind_of(cls, key))}",
                          source) from None
    return check_value(cls, key, value, source)


def cannot_listen(key: str, value, e: OSError) -> ConfigError:
    """A daemon could not bind the address a setting names (in use, not this machine's)."""
    why = os.strerror(e.errno) if e.errno else str(e)
    return refusal(key, value, f"cannot listen there: {why}")


def refusal(key: str, value, why: str, source: str | None = None) -> ConfigError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    where = f" ({source})" if source else ""
    return ConfigError(f"{key} = {shown}{where}: {why}", key=key)


def describe(node) -> str:
    """What a value of this kind must be, in words (messages and docs/operations.md)."""
    if isinstance(node, mi.UnionType):
        return " or ".join(describe(t) for t in node.types if not isinstance(t, mi.NoneType))
    if isinstance(node, mi.Metadata):
        form = (node.extra or {}).get("form")
        if form == "address":
            return "HOST:PORT (port 0..65535)"
        if form == "draft":
            return "early-exit:K (K >= 1)"
        return describe(node.type)
    if isinstance(node, mi.BoolType):
        return "true or false"
    if isinstance(node, mi.StrType):
        return "a string"
    if isinstance(node, mi.LiteralType):
        return "one of " + ", ".join(str(v) for v in node.values)
    if isinstance(node, mi.IntType):
        return "an integer " + _bounds(node, integer=True)
    if isinstance(node, mi.FloatType):
        return "a finite number " + _bounds(node, integer=False)
    raise TypeError(f"no description for {node!r}")


def _bounds(node, integer: bool) -> str:
    lo, hi = node.ge, node.le
    if integer and node.gt is not None:
        lo = node.gt + 1
    if integer and node.lt is not None:
        hi = node.lt - 1
    if lo is not None and hi is not None:
        return f"in {_num(lo)}..{_num(hi)}"
    if node.gt is not None and lo is None:
        return f"> {_num(node.gt)}"
    if lo is not None:
        return f">= {_num(lo)}"
    return f"<= {_num(hi)}" if hi is not None else ""


def _num(x) -> str:
    x = int(x) if float(x).is_integer() else x
    if isinstance(x, int) and x > 1 << 16:
        if x & (x - 1) == 0:
            return f"2^{x.bit_length() - 1}"
        if (x + 1) & x == 0:
            return f"2^{x.bit_length()} - 1"
    return f"{x:g}" if isinstance(x, float) else str(x)


def _bare(node):
    """The type without None and without metadata."""
    if isinstance(node, mi.UnionType):
        node = next(t for t in node.types if not isinstance(t, mi.NoneType))
    return node.type if isinstance(node, mi.Metadata) else node


def _wants_float(node) -> bool:
    return isinstance(_bare(node), mi.FloatType)


def _accepts(node, v) -> bool:
    if isinstance(node, mi.UnionType):
        return any(_accepts(t, v) for t in node.types)
    if isinstance(node, mi.NoneType):
        return v is None
    if isinstance(node, mi.Metadata):
        if not _accepts(node.type, v):
            return False
        form = (node.extra or {}).get("form")
        try:
            if form == "address":
                parse_hostport(v)
            elif form == "draft":
                early_exit_depth(v)
        except (ConfigError, ValueError):
            return False
        return True
    if isinstance(node, mi.BoolType):
        return isinstance(v, bool)
    if isinstance(node, mi.StrType):
        return isinstance(v, str)
    if isinstance(node, mi.LiteralType):
        return any(type(v) is type(x) and v == x for x in node.values)
    if isinstance(node, mi.IntType):
        return isinstance(v, int) and not isinstance(v, bool) and _within(node, v)
    if isinstance(node, mi.FloatType):
        return (isinstance(v, float | int) and not isinstance(v, bool) and math.isfinite(v)
                and _within(node, v))
    raise TypeError(f"no check for {node!r}")


def _within(node, v) -> bool:
    return ((node.ge is None or v >= node.ge) and (node.gt is None or v > node.gt)
            and (node.le is None or v <= node.le) and (node.lt is None or v < node.lt))
