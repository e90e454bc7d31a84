"""``pp1q verifier``: wire the link, the scheduler and its decider, the HTTP API and the
metrics."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from pp1q.core.drawkey import DRAW_KEY_ID
from pp1q.core.errors import ConfigError, Reason
from pp1q.models.engine import PREFILL_CHUNK
from pp1q.models.serving import TOY, load_target
from pp1q.models.text import TextCodec
from pp1q.models.toy import ToySpec, ToyTarget
from pp1q.runtime import tls
from pp1q.runtime.config import open_capture
from pp1q.runtime.draw_secret import load_draw_keys
from pp1q.runtime.metrics import Metrics, serve_until_stopped
from pp1q.runtime.settings import VerifierSettings, cannot_listen, parse_hostport
from pp1q.runtime.warmup import warm_up_checks
from pp1q.verifier.api import decode_generate
from pp1q.verifier.breaker import BreakerConfig
from pp1q.verifier.decider import Decider
from pp1q.verifier.engine_decider import EngineDecider
from pp1q.verifier.http import HttpError
from pp1q.verifier.kernel_decider import KernelDecider
from pp1q.verifier.kernel_rounds import warm_up_decisions
from pp1q.verifier.link import Needs, WorkerLink
from pp1q.verifier.openai_routes import openai_routes
from pp1q.verifier.ranks.launch import rank_plan
from pp1q.verifier.ranks.replica import RankDecisions
from pp1q.verifier.scheduler import Scheduler
from pp1q.verifier.server import HttpServer, Limits, read_body, request_address
from pp1q.wire import WIRE_V2
from pp1q.wire.session_config import DEFAULT_MAX_SUPPORT, engine_identity, verifier_config
from pp1q_kernels.shard_processors import MAX_SHARD_TOP_K

log = logging.getLogger("pp1q.verifier")


@dataclass(frozen=True)
class Deciders:
    """How a verifier decides: ``local(target, slots=, depth=, draws=, target_delay_s=)``
    builds the Decider of one process; ``rank(target, limits)`` the decisions of each rank's
    replica under ``--ranks N`` (rank 0's Decider is then a RankedDecider over them).
    Production runs ``STANDARD``; a planted-bug test passes its own to ``serve``."""

    local: Callable[..., Decider] = KernelDecider
    rank: Callable[..., RankDecisions] = RankDecisions
    engine: Callable[..., Decider] = EngineDecider  # a real model's Target (same keywords)


STANDARD = Deciders()


def build(settings: VerifierSettings, deciders: Deciders = STANDARD, plan=None):
    """(link, scheduler, metrics, config) from settings (checked when they were made).
    ``plan``: rank 0's RankPlan in a group (its decider gets the group from start_group)."""
    if settings.model != TOY:
        return _build_engine(settings, deciders, plan)
    ranked = plan is not None
    spec = ToySpec(vocab=settings.vocab, seed=settings.model_seed)
    slots, depth, top_k = settings.slots, settings.depth, settings.top_k
    versions = settings.versions
    host, port = parse_hostport(settings.worker)
    config = verifier_config(spec, versions, slots, depth, DEFAULT_MAX_SUPPORT)
    target = ToyTarget(spec)
    metrics = Metrics("verifier", {"target": target.identity, "draft": spec.draft_identity,
                                   "wire_versions": ",".join(map(str, versions))})
    metrics.speculation.info({"mode": settings.speculation})
    draws = load_draw_keys(settings.draw_secret_file)
    needs = Needs(slots=slots, depth=depth, support=min(top_k, spec.vocab))
    link = WorkerLink(host, port, config, needs, metrics, settings.step_timeout_s,
                      settings.reconnect_max_s, tls=tls.client_tls(settings, host, metrics),
                      breaker=breaker_config(settings))
    delay_s = settings.target_delay_ms / 1000.0
    if ranked:
        from pp1q.verifier.ranks.decider import RankedDecider

        decider = RankedDecider(target, metrics, draws, delay_s, deciders.rank,
                                sharded=settings.shard_vocab)
    else:
        decider = deciders.local(target, slots=slots, depth=depth, draws=draws,
                                 target_delay_s=delay_s)
    scheduler = Scheduler(link, decider, metrics, slots=slots, depth=depth,
                          queued_per_address=settings.requests_queued_per_address)
    return link, scheduler, metrics, config


def _load_engine(settings: VerifierSettings, plan, versions):
    """(loaded, config) of a real model: the whole target in one process, or with
    ``plan`` (a rank of a --shard-vocab group) this rank's rows of its LM head."""
    if plan is None:
        loaded = load_target(settings)
    else:
        from pp1q.verifier.ranks.sharded import balanced

        if not settings.shard_vocab:
            raise ConfigError("ranks > 1 with a real model needs --shard-vocab (each rank "
                              "holds its rows of the LM head); replicated ranks serve the "
                              "toy target only", key="ranks")
        rv = plan.rv
        loaded = load_target(settings, shard=lambda vocab: balanced(vocab, rv.world)[rv.rank],
                             device=rank_device(settings.device, rv.local_rank))
    ident = engine_identity(loaded.vocab, loaded.tokenizer_digest, loaded.draft_id,
                            loaded.target_id, loaded.draft_adapted)
    config = verifier_config(ident, versions, settings.slots, settings.depth,
                             DEFAULT_MAX_SUPPORT)
    log.info("target %s loaded in %.1f s", loaded.target_id, loaded.load_seconds)
    return loaded, config


def rank_device(device: str, local_rank: int) -> str:
    """A rank's torch device: ``cuda`` without an index means this rank's own GPU, which
    must exist (else a ConfigError now, not torch's "invalid device ordinal" mid-load)."""
    if device != "cuda":
        return device
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if local_rank >= gpus:
        raise ConfigError(f"device cuda: local rank {local_rank} has no GPU of its own (this "
                          f"machine has {gpus}); run at most {gpus} ranks a machine, or name "
                          "the device (cuda:0)", key="device")
    return f"cuda:{local_rank}"


def _build_engine(settings: VerifierSettings, deciders: Deciders, plan):
    """A real model's target (pp1q.models.serving) behind ``deciders.engine``, or with
    ``plan`` rank 0's shard of it behind a RankedDecider (--shard-vocab)."""
    versions = settings.versions
    loaded, config = _load_engine(settings, plan, versions)
    metrics = Metrics("verifier", {"target": loaded.target_id, "draft": loaded.draft_id,
                                   "wire_versions": ",".join(map(str, versions))})
    metrics.speculation.info({"mode": settings.speculation})
    host, port = parse_hostport(settings.worker)
    needs = Needs(slots=settings.slots, depth=settings.depth,
                  support=min(settings.top_k, loaded.vocab))
    link = WorkerLink(host, port, config, needs, metrics, settings.step_timeout_s,
                      settings.reconnect_max_s, tls=tls.client_tls(settings, host, metrics),
                      breaker=breaker_config(settings))
    draws = load_draw_keys(settings.draw_secret_file)
    delay_s = settings.target_delay_ms / 1000.0
    if plan is not None:
        from pp1q.verifier.ranks.decider import RankedDecider

        decider = RankedDecider(loaded.engine, metrics, draws, delay_s, deciders.rank,
                                sharded=True, prefill_chunk=PREFILL_CHUNK)
    else:
        decider = deciders.engine(loaded.engine, slots=settings.slots, depth=settings.depth,
                                  draws=draws, target_delay_s=delay_s)
    scheduler = Scheduler(link, decider, metrics, slots=settings.slots, depth=settings.depth,
                          text=TextCodec(loaded.tokenizer), max_positions=loaded.max_positions,
                          queued_per_address=settings.requests_queued_per_address)
    return link, scheduler, metrics, config


def breaker_config(settings: VerifierSettings) -> BreakerConfig:
    return BreakerConfig(after_timeouts=settings.breaker_after_timeouts,
                         open_s=settings.breaker_open_s, open_max_s=settings.breaker_open_max_s)


def unsupported_processors(settings: VerifierSettings, processors,
                           world: int) -> str | None:
    """Why a rank group of ``world`` ranks (the group's, not ``settings.ranks``: torchrun
    sets it through its environment) cannot apply these target processors exactly (None:
    it can). One process and a replicated group decide from whole rows (the deciding rank
    applies them as one process does, pp1q.verifier.target_rows); vocabulary shards apply
    the temperature element by element and top-k / top-p in exact integers across the
    shards (pp1q_kernels.shard_processors), top-k up to MAX_SHARD_TOP_K ids."""
    if world <= 1 or not settings.shard_vocab:
        return None
    if processors.top_k is None or processors.top_k <= MAX_SHARD_TOP_K:
        return None  # processors.top_k is None when k >= vocab (every id)
    return (f"vocabulary-sharded ranks (--shard-vocab) apply a target top_k of at most "
            f"{MAX_SHARD_TOP_K} (each rank gathers every rank's k largest), not "
            f"{processors.top_k}")


def decoder_off_loop(tokenizes: bool):
    """``await decoded(fn, *args, **kw)``: a request body's decoding, which for a real
    target tokenizes its text (a 1 MiB prompt is ~0.8 s of tokenizing: on the event loop
    it stalled every round, the worker link and /healthz), run in one thread of its own.
    One thread, never more: a Rust tokenizer called from two threads at once can refuse
    ("Already borrowed"). Without a tokenizer (the toy) decoding is microseconds: inline."""
    if not tokenizes:
        async def inline(fn, *args, **kw):
            return fn(*args, **kw)
        return inline
    thread = ThreadPoolExecutor(1, thread_name_prefix="pp1q-tokenize")

    async def off_loop(fn, *args, **kw):
        return await asyncio.get_running_loop().run_in_executor(
            thread, functools.partial(fn, *args, **kw))
    return off_loop


def check_context(req, scheduler: Scheduler):
    """``req`` if its prompt and max_tokens fit in the target's context (as OpenAI counts
    it), else a 422 before it takes a slot: a prompt past the model's positions costs a
    prefill of any length (quadratic attention, gigabytes, uninterruptible in the
    decider's thread) and answers from positions the model never learnt. (Rounds whose
    drafts would pass the context run target-only: the scheduler's rule.)"""
    limit = scheduler.max_positions
    if limit is None or len(req.prompt) + req.max_tokens <= limit:
        return req
    scheduler.metrics.request_refused(Reason.CONTEXT_LENGTH_EXCEEDED)
    raise HttpError(422, Reason.CONTEXT_LENGTH_EXCEEDED.value,
                    f"the prompt ({len(req.prompt)} tokens) and max_tokens ({req.max_tokens})"
                    f" come to {len(req.prompt) + req.max_tokens}; the target's context is "
                    f"{limit} tokens")


def routes(settings: VerifierSettings, link: WorkerLink, scheduler: Scheduler, config,
           world: int = 1) -> dict:
    """Every route of the verifier's HTTP API (docs/operations.md, "HTTP API");
    ``world``: the verifier's ranks (1: one process)."""
    vocab = config.identity.vocab
    top_k = settings.top_k
    default_top_k = top_k if 0 < top_k < vocab else None  # k >= vocab: the dense support
    mode = settings.speculation
    decode_kw = {"vocab": vocab, "default_top_k": default_top_k,
                 "max_support": config.limits.max_support, "text": scheduler.text}
    decoded = decoder_off_loop(scheduler.text is not None)

    def check(req):
        """The request as this verifier will run it (speculation mode, rank limits);
        the OpenAI routes call it on their decoded request too."""
        why = unsupported_processors(settings, req.processors, world)
        if why is not None:
            scheduler.metrics.request_refused(Reason.UNSUPPORTED_PROCESSORS)
            raise HttpError(422, Reason.UNSUPPORTED_PROCESSORS.value, why)
        if mode == "off" and req.speculative:  # every request target-only, as configured
            req = dataclasses.replace(req, speculative=False)
        if mode == "greedy" and req.speculative and not req.greedy:
            raise HttpError(422, "sampled_on_v1",
                            "this verifier runs greedy (v1) speculation: send temperature 0, "
                            "or speculative false; sampled speculation needs speculation = "
                            "\"sampled\" on both daemons")
        return check_context(req, scheduler)

    async def generate(request):
        req = check(await decoded(decode_generate, await read_body(request), **decode_kw))
        return 200, await scheduler.generate(req, address=request_address(request))

    async def healthz(request):
        # 200 while requests are served (degraded: target-only, exact, slower); 503 when
        # they are not (ranks lost, stopping): what a load balancer routes by
        link_health = (link.health() if mode != "off" else
                       {"worker": "disconnected", "cause": "speculation_off", "detail": None})
        degraded = mode != "off" and link_health["worker"] != "connected"
        answer = {"status": "degraded" if degraded else "ok", **link_health,
                  "wire_version": link.version if link.ready else None,
                  "speculation": mode,
                  "target": config.identity.target_id, "slots": scheduler.pool.size,
                  "depth": scheduler.depth}
        if scheduler.stopping:  # SIGTERM: draining; route new requests elsewhere
            return 503, {**answer, "status": "stopping"}
        ranks = scheduler.decider.health()  # --ranks N: the group's state
        if ranks is not None:
            answer["ranks"] = ranks
            if ranks["state"] != "up":
                return 503, {**answer, "status": "ranks_lost"}
        return 200, answer

    return {("POST", "/v1/generate"): generate, ("GET", "/healthz"): healthz,
            **openai_routes(scheduler, model_id=config.identity.target_id,
                            tokenizer=scheduler.text, decode_kw=decode_kw,
                            check=check, decoded=decoded)}


async def serve(settings: VerifierSettings, stop: asyncio.Event, ready=None, *,
                deciders: Deciders = STANDARD, child_command: list[str] | None = None) -> int:
    """Run until ``stop`` is set. ``ready(http_port, metrics_port)`` once listening.
    With ``--ranks N``: rank 0 serves (``child_command`` starts spawned ranks), the
    other ranks follow it (pp1q.verifier.ranks.group); the exit status says how it ended.
    ``deciders``: how decisions are made (STANDARD; a planted-bug test passes its own)."""
    warm_up_checks(settings, "verifier")
    warm_up_decisions()
    plan = rank_plan(settings)
    if plan is not None and plan.rv.rank > 0:
        return await _serve_follower(settings, plan, stop, deciders)
    group = launch = None
    if plan is not None:
        from pp1q.runtime.launcher import pp1q_command
        from pp1q.verifier.ranks.group import EXIT_RANKS_LOST, start_group
        from pp1q.verifier.ranks.launch import Launch

        launch = Launch(plan, settings, child_command or pp1q_command("verifier"))
    try:
        link, scheduler, metrics, config = build(settings, deciders, plan)
    except BaseException:
        if launch is not None:
            launch.abandon()
        raise
    if launch is not None:
        group = await start_group(settings, launch, scheduler.decider, config, stop)
        if group is None:  # the ranks did not all join in time: let the supervisor retry
            return EXIT_RANKS_LOST
    # a target with a tokenizer takes text (scheduler.text; the toy has none)
    http = HttpServer(routes(settings, link, scheduler, config,
                             plan.rv.world if plan is not None else 1),
                      Limits(max_connections_per_address=settings.http_connections_per_address),
                      on_refused=metrics.request_refused,
                      on_aborted=metrics.http_connection_aborted)
    host, port = parse_hostport(settings.http)
    try:
        port = await http.start(host, port)
    except OSError as e:  # in use, not an address of this machine, ...
        if group is not None:
            await group.close()
        raise cannot_listen("http", settings.http, e) from None
    # the worker link's traffic (every wire frame); replay needs the watchdog
    # a capture names the draw secret by its fingerprint only (replay --draw-secret-file)
    draws = scheduler.decider.draws
    cap = link.capture = open_capture(settings.capture, "verifier", {
        "step_timeout_s": settings.step_timeout_s,
        "draw_key": {"id": DRAW_KEY_ID,
                     "fingerprint": draws.fingerprint if draws is not None else None}},
        settings.capture_max_bytes)
    speculating = settings.speculation != "off"
    link_stop = asyncio.Event()  # set after the drain: requests draining still speculate
    link_task = asyncio.get_running_loop().create_task(
        link.run(link_stop) if speculating else link_stop.wait())  # off: never dialled
    log.info("speculation %s: %s", settings.speculation, {
        "off": "every request target-only, no worker link",
        "greedy": "greedy (v1) speculation; sampled requests are refused (422)",
        "sampled": "sampled (v2) speculation with exact q; greedy requests too"}[
            settings.speculation])
    def on_ready(http_port: int, metrics_port: int | None) -> None:
        if group is not None and metrics_port:  # /healthz lists every rank's /metrics
            group.metrics_at = f"{settings.metrics_host}:{metrics_port}"
        if ready is not None:
            ready(http_port, metrics_port)

    try:
        banner = f"pp1q verifier HTTP on {host}:{port}, " + (
            f"worker {settings.worker}" if speculating else "no worker (speculation off)")
        if group is not None:
            banner += f", ranks {group.world}"
        await serve_until_stopped(metrics, settings, banner, port, stop, on_ready,
                                  draining=lambda: drain(http, scheduler,
                                                         settings.drain_timeout_s))
    finally:
        link_stop.set()
        await http.close()
        link_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await link_task
        if cap is not None:
            cap.close()
        if group is not None:
            await group.close()
    return group.exit_status if group is not None else 0


async def drain(http: HttpServer, scheduler: Scheduler, timeout: float) -> None:
    """SIGTERM: accept no connection, answer queued requests 503 ``stopping``, let the
    running ones finish within ``timeout`` (docs/operations.md, "Stopping")."""
    http.stop_accepting()
    log.info("stopping: accepting no new connections; draining up to %g s", timeout)
    d = await scheduler.drain(timeout)
    (log.warning if d.cut else log.info)(
        "stopped: %d in-flight requests finished, %d cut at the %g s deadline (503 stopping), "
        "%d queued answered 503 stopping", d.finished, d.cut, timeout, d.queued)


async def _serve_follower(settings: VerifierSettings, plan, stop: asyncio.Event,
                          deciders: Deciders) -> int:
    """Ranks 1..N-1: the target and the replica, no worker link, no HTTP API."""
    from pp1q.verifier.ranks.follower import serve_follower
    from pp1q.verifier.ranks.launch import limits_of

    if settings.model != TOY:  # this rank's rows of a real model's head
        loaded, config = _load_engine(settings, plan, (WIRE_V2,))
        target = loaded.engine
    else:
        spec = ToySpec(vocab=settings.vocab, seed=settings.model_seed)
        config = verifier_config(spec, (WIRE_V2,), settings.slots, settings.depth,
                                 DEFAULT_MAX_SUPPORT)
        target = ToyTarget(spec)
    metrics = Metrics("verifier", {"target": target.identity, "rank": str(plan.rv.rank)})
    metrics.rank_world_size.set(plan.rv.world)
    return await serve_follower(settings, plan,
                                limits_of(config, plan.rv.world, settings.shard_vocab),
                                target, metrics, stop, deciders.rank)
