"""``pp1q verifier``: wire the link, the scheduler and its decider, the HTTP API and the
metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from pp1q.models.toy import ToySpec, ToyTarget
from pp1q.runtime import tls
from pp1q.runtime.config import open_capture
from pp1q.runtime.metrics import Metrics, serve_until_stopped
from pp1q.runtime.settings import VerifierSettings, cannot_listen, parse_hostport
from pp1q.verifier.api import decode_generate
from pp1q.verifier.decider import Decider, LocalDecider
from pp1q.verifier.http import HttpError
from pp1q.verifier.link import Needs, WorkerLink
from pp1q.verifier.openai_routes import openai_routes
from pp1q.verifier.ranks.launch import rank_plan
from pp1q.verifier.ranks.replica import RankDecisions
from pp1q.verifier.scheduler import Scheduler
from pp1q.verifier.server import HttpServer, read_body
from pp1q.wire import WIRE_V1, WIRE_V2
from pp1q.wire.session_config import DEFAULT_MAX_SUPPORT, verifier_config

log = logging.getLogger("pp1q.verifier")




@dataclass(frozen=True)
class Deciders:
    """How a verifier decides: ``local(target, slots=, depth=, target_delay_s=)`` builds
    the Decider of one process; ``rank(target, limits)`` the decisions of each rank's
    replica under ``--ranks N`` (rank 0's Decider is then a RankedDecider over them).
    Production runs ``STANDARD``; a planted-bug test passes its own to ``serve``."""

    local: Callable[..., Decider] = LocalDecider
    rank: Callable[..., RankDecisions] = RankDecisions


STANDARD = Deciders()


def build(settings: VerifierSettings, deciders: Deciders = STANDARD, ranked: bool = False):
    """(link, scheduler, metrics, config) from settings (checked when they were made).
    ``ranked``: rank 0 of a group (its decider gets the group from start_group)."""
    spec = ToySpec(vocab=settings.vocab, seed=settings.model_seed)
    slots, depth, top_k = settings.slots, settings.depth, settings.top_k
    versions = (WIRE_V2, WIRE_V1) if settings.wire_version == WIRE_V2 else (WIRE_V1,)
    host, port = parse_hostport(settings.worker)
    config = verifier_config(spec, versions, slots, depth, DEFAULT_MAX_SUPPORT)
    target = ToyTarget(spec)
    metrics = Metrics("verifier", {"target": target.identity, "draft": spec.draft_identity,
                                   "wire_versions": ",".join(map(str, versions))})
    needs = Needs(slots=slots, depth=depth, support=min(top_k, spec.vocab))
    link = WorkerLink(host, port, config, needs, metrics, settings.watchdog_ms / 1000.0,
                      settings.reconnect_max_s, tls=tls.client_tls(settings, host, metrics))
    delay_s = settings.target_delay_ms / 1000.0
    if ranked:
        from pp1q.verifier.ranks.decider import RankedDecider

        decider = RankedDecider(target, metrics, delay_s, deciders.rank)
    else:
        decider = deciders.local(target, slots=slots, depth=depth, target_delay_s=delay_s)
    scheduler = Scheduler(link, decider, metrics, slots=slots, depth=depth)
    return link, scheduler, metrics, config


def routes(settings: VerifierSettings, link: WorkerLink, scheduler: Scheduler, config,
           tokenizer=None) -> dict:
    """Every route of the verifier's HTTP API (docs/operations.md, "HTTP API")."""
    vocab = config.identity.vocab
    top_k = settings.top_k
    default_top_k = top_k if 0 < top_k < vocab else None  # k >= vocab: the dense support
    v1_only = settings.wire_version == WIRE_V1
    decode_kw = {"vocab": vocab, "default_top_k": default_top_k,
                 "max_support": config.limits.max_support}

    def check(req) -> None:
        if v1_only and req.speculative and not req.greedy:
            raise HttpError(422, "sampled_on_v1",
                            "this verifier runs a v1 (greedy) session: send temperature 0, "
                            "or speculative false; sampled speculation needs wire v2")

    async def generate(request):
        req = decode_generate(await read_body(request), **decode_kw)
        check(req)
        return 200, await scheduler.generate(req)

    async def healthz(request):
        answer = {"status": "ok", "worker": "connected" if link.ready else "disconnected",
                  "wire_version": link.version if link.ready else None,
                  "target": config.identity.target_id, "slots": scheduler.pool.size,
                  "depth": scheduler.depth}
        ranks = scheduler.decider.health()  # --ranks N: the group's state
        if ranks is not None:
            answer["ranks"] = ranks
            if ranks["state"] != "up":
                return 503, {**answer, "status": "ranks_lost"}
        return 200, answer

    return {("POST", "/v1/generate"): generate, ("GET", "/healthz"): healthz,
            **openai_routes(scheduler, model_id=config.identity.target_id,
                            tokenizer=tokenizer, decode_kw=decode_kw,
                            check=lambda call: check(call.req))}


async def serve(settings: VerifierSettings, stop: asyncio.Event, ready=None, *,
                deciders: Deciders = STANDARD, child_command: list[str] | None = None) -> int:
    """Run until ``stop`` is set. ``ready(http_port, metrics_port)`` once listening.
    With ``--ranks N``: rank 0 serves (``child_command`` starts spawned ranks), the
    other ranks follow it (pp1q.verifier.ranks.group); the exit status says how it ended.
    ``deciders``: how decisions are made (STANDARD; a planted-bug test passes its own)."""
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
        link, scheduler, metrics, config = build(settings, deciders, ranked=plan is not None)
    except BaseException:
        if launch is not None:
            launch.abandon()
        raise
    if launch is not None:
        group = await start_group(settings, launch, scheduler.decider, config, stop)
        if group is None:  # the ranks did not all join in time: let the supervisor retry
            return EXIT_RANKS_LOST
    # a target with a tokenizer takes text (pp1q.verifier.openai_api); the toy has none
    tokenizer = getattr(getattr(scheduler.decider, "target", None), "tokenizer", None)
    http = HttpServer(routes(settings, link, scheduler, config, tokenizer))
    host, port = parse_hostport(settings.http)
    try:
        port = await http.start(host, port)
    except OSError as e:  # in use, not an address of this machine, ...
        if group is not None:
            await group.close()
        raise cannot_listen("http", settings.http, e) from None
    # the worker link's traffic (wire and context channel); replay needs the watchdog
    cap = link.capture = open_capture(settings.capture, "verifier",
                                      {"step_timeout_s": settings.watchdog_ms / 1e3})
    link_task = asyncio.get_running_loop().create_task(link.run(stop))
    try:
        banner = f"pp1q verifier HTTP on {host}:{port}, worker {settings.worker}"
        if group is not None:
            banner += f", ranks {group.world}"
        await serve_until_stopped(metrics, settings, banner, port, stop, ready)
    finally:
        await http.close()
        link_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await link_task
        if cap is not None:
            cap.close()
        if group is not None:
            await group.close()
    return group.exit_status if group is not None else 0


async def _serve_follower(settings: VerifierSettings, plan, stop: asyncio.Event,
                          deciders: Deciders) -> int:
    """Ranks 1..N-1: the target and the replica, no worker link, no HTTP API."""
    from pp1q.verifier.ranks.follower import serve_follower
    from pp1q.verifier.ranks.launch import limits_of

    spec = ToySpec(vocab=settings.vocab, seed=settings.model_seed)
    config = verifier_config(spec, (WIRE_V2,), settings.slots, settings.depth,
                             DEFAULT_MAX_SUPPORT)
    target = ToyTarget(spec)
    metrics = Metrics("verifier", {"target": target.identity, "rank": str(plan.rv.rank)})
    metrics.rank_world_size.set(plan.rv.world)
    return await serve_follower(settings, plan, limits_of(config, plan.rv.world), target,
                                metrics, stop, deciders.rank)
