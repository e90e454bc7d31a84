"""``pp1q verifier``: wire the link, the scheduler, the HTTP API and the metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from .. import tls
from ..config import ConfigError, open_capture, parse_hostport
from ..metrics import Metrics, serve_until_stopped
from ..models import ToySpec, ToyTarget
from ..session_config import DEFAULT_MAX_SUPPORT, verifier_config
from ..wire import WIRE_V1, WIRE_V2
from .api import decode_generate
from .http import HttpError, HttpServer
from .link import Needs, WorkerLink
from .scheduler import Scheduler

log = logging.getLogger("pp1q.verifier")

MAX_SLOTS = 64  # the scheduler preallocates target rows per slot; bound that memory
MAX_DEPTH = 16  # the design fixes depth 5; a larger value is an experiment, bounded


def build(settings: dict, scheduler_cls: type[Scheduler] = Scheduler):
    """(link, scheduler, metrics, config) from resolved settings; ConfigError if invalid."""
    try:
        spec = ToySpec(vocab=settings["vocab"], seed=settings["model_seed"])
    except ValueError as e:
        raise ConfigError(str(e)) from None
    slots, depth, top_k = settings["slots"], settings["depth"], settings["top_k"]
    if not 1 <= slots <= MAX_SLOTS:
        raise ConfigError(f"slots {slots} outside 1..{MAX_SLOTS}")
    if not 1 <= depth <= MAX_DEPTH:
        raise ConfigError(f"depth {depth} outside 1..{MAX_DEPTH}")
    if not 0 <= top_k <= DEFAULT_MAX_SUPPORT:
        raise ConfigError(f"top_k {top_k} outside 0..{DEFAULT_MAX_SUPPORT} (0 = dense)")
    if settings["watchdog_ms"] <= 0 or settings["reconnect_max_s"] <= 0:
        raise ConfigError("watchdog_ms and reconnect_max_s must be positive")
    if settings["target_delay_ms"] < 0:
        raise ConfigError("target_delay_ms must be >= 0")
    if settings["wire_version"] not in (WIRE_V1, WIRE_V2):
        raise ConfigError(f"wire_version {settings['wire_version']}: 1 or 2")
    versions = (WIRE_V2, WIRE_V1) if settings["wire_version"] == WIRE_V2 else (WIRE_V1,)
    host, port = parse_hostport(settings["worker"], "--worker")
    config = verifier_config(spec, versions, slots, depth, DEFAULT_MAX_SUPPORT)
    target = ToyTarget(spec)
    metrics = Metrics("verifier", {"target": target.identity, "draft": spec.draft_identity,
                                   "wire_versions": ",".join(map(str, versions))})
    needs = Needs(slots=slots, depth=depth, support=min(top_k, spec.vocab))
    link = WorkerLink(host, port, config, needs, metrics, settings["watchdog_ms"] / 1000.0,
                      settings["reconnect_max_s"], tls=tls.client_tls(settings, host, metrics))
    scheduler = scheduler_cls(link, target, metrics, slots=slots, depth=depth,
                              target_delay_s=settings["target_delay_ms"] / 1000.0)
    return link, scheduler, metrics, config


def routes(settings: dict, link: WorkerLink, scheduler: Scheduler, config) -> dict:
    vocab = config.identity.vocab
    top_k = settings["top_k"]
    default_top_k = top_k if 0 < top_k < vocab else None  # k >= vocab: the dense support
    v1_only = settings["wire_version"] == WIRE_V1

    async def generate(head, body):
        req = decode_generate(body, vocab=vocab, default_top_k=default_top_k,
                              max_support=config.limits.max_support)
        if v1_only and req.speculative and not req.greedy:
            raise HttpError(422, "sampled_on_v1",
                            "this verifier runs a v1 (greedy) session: send temperature 0, "
                            "or speculative false; sampled speculation needs wire v2")
        return 200, await scheduler.generate(req)

    async def healthz(head, body):
        return 200, {"status": "ok", "worker": "connected" if link.ready else "disconnected",
                     "wire_version": link.version if link.ready else None,
                     "target": scheduler.target.identity, "slots": scheduler.pool.size,
                     "depth": scheduler.depth}

    return {("POST", "/v1/generate"): generate, ("GET", "/healthz"): healthz}


async def serve(settings: dict, stop: asyncio.Event, ready=None,
                scheduler_cls: type[Scheduler] = Scheduler) -> int:
    """Run until ``stop`` is set. ``ready(http_port, metrics_port)`` once listening."""
    link, scheduler, metrics, config = build(settings, scheduler_cls)
    http = HttpServer(routes(settings, link, scheduler, config))
    host, port = parse_hostport(settings["http"], "--http")
    port = await http.start(host, port)
    # the worker link's traffic (wire and context channel); replay needs the watchdog
    cap = link.capture = open_capture(settings, "verifier",
                                      {"step_timeout_s": settings["watchdog_ms"] / 1e3})
    link_task = asyncio.get_running_loop().create_task(link.run(stop))
    try:
        banner = f"pp1q verifier HTTP on {host}:{port}, worker {settings['worker']}"
        await serve_until_stopped(metrics, settings, banner, port, stop, ready)
    finally:
        await http.close()
        link_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await link_task
        if cap is not None:
            cap.close()
    return 0
