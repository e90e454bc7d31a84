"""``pp1q worker``: serve wire v2 (and the context channel) on one TCP port."""

from __future__ import annotations

import asyncio
import logging

from ..config import ConfigError, parse_hostport
from ..metrics import Metrics
from ..models import ToyDrafter, ToySpec
from ..session_config import parse_versions, worker_config
from .connection import WorkerConnection
from .state import WorkerState

log = logging.getLogger("pp1q.worker")


def build(settings: dict):
    """(wire config, drafter, metrics) from resolved settings; ConfigError if invalid."""
    try:
        spec = ToySpec(vocab=settings["vocab"], seed=settings["model_seed"])
        drafter = ToyDrafter.preset(spec, settings["draft_preset"])
        if settings["draft_distance"] is not None:
            drafter = ToyDrafter(spec, settings["draft_distance"], drafter.adversarial)
        versions = parse_versions(settings["wire_versions"])
    except ValueError as e:
        raise ConfigError(str(e)) from None
    config = worker_config(spec, versions, settings["max_support"])
    metrics = Metrics("worker", {"draft": drafter.identity, "variant": drafter.variant,
                                 "target": drafter.target_identity,
                                 "wire_versions": ",".join(map(str, versions))})
    return config, drafter, metrics


async def serve(settings: dict, stop: asyncio.Event, ready=None) -> int:
    """Run until ``stop`` is set. ``ready(port, metrics_port)`` is called once listening."""
    config, drafter, metrics = build(settings)
    host, port = parse_hostport(settings["listen"], "--listen")
    state = WorkerState()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: WorkerConnection(config, state, drafter, metrics), host, port)
    port = server.sockets[0].getsockname()[1]
    metrics_server = None
    if settings["metrics_port"] is not None:
        metrics_server = metrics.serve(settings["metrics_host"], settings["metrics_port"])
    mport = metrics_server.server_port if metrics_server else None
    log.info("worker listening on %s:%d (%s, %s); metrics %s", host, port, drafter.identity,
             drafter.variant, f"http://{settings['metrics_host']}:{mport}/metrics"
             if mport else "off")
    print(f"pp1q worker listening on {host}:{port}"
          + (f" metrics on {settings['metrics_host']}:{mport}" if mport else ""), flush=True)
    if ready is not None:
        ready(port, mport)
    try:
        await stop.wait()
    finally:
        server.close()
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
    return 0
