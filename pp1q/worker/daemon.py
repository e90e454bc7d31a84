"""``pp1q worker``: serve wire v2 (revision 3: the request context included) on one port."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pp1q.core.drawkey import DRAW_KEY_ID
from pp1q.models.engine import Drafter
from pp1q.models.serving import TOY, load_drafter
from pp1q.models.toy import DraftModel, ToyDrafter, ToySpec
from pp1q.runtime import tls
from pp1q.runtime.capture import tap
from pp1q.runtime.config import open_capture
from pp1q.runtime.metrics import Metrics, serve_until_stopped
from pp1q.runtime.settings import WorkerSettings, cannot_listen, parse_hostport
from pp1q.runtime.warmup import warm_up_checks
from pp1q.wire.session_config import engine_identity, worker_config
from pp1q.wire.sessions import SessionTable
from pp1q.worker.connection import WorkerConnection
from pp1q.worker.drafting import Proposer
from pp1q.worker.engine_proposer import EngineProposer

log = logging.getLogger("pp1q.worker")


def build(settings: WorkerSettings):
    """(wire config, drafter, metrics) from settings (checked when they were made)."""
    if settings.model != TOY:
        return _build_engine(settings)
    spec = ToySpec(vocab=settings.vocab, seed=settings.model_seed)
    drafter = ToyDrafter.preset(spec, settings.draft_preset)
    if settings.draft_distance is not None:
        drafter = ToyDrafter(spec, settings.draft_distance, drafter.adversarial)
    versions = settings.versions
    config = worker_config(spec, versions, settings.max_support)
    metrics = Metrics("worker", {"draft": drafter.identity, "variant": drafter.variant,
                                 "target": drafter.target_identity,
                                 "wire_versions": ",".join(map(str, versions))})
    metrics.speculation.info({"mode": settings.speculation})
    return config, drafter, metrics


def _build_engine(settings: WorkerSettings):
    """A real model's drafter (pp1q.models.serving); HELLO names the pair it drafts for."""
    loaded = load_drafter(settings)
    ident = engine_identity(loaded.vocab, loaded.tokenizer_digest, loaded.draft_id,
                            loaded.target_id, loaded.draft_adapted)
    config = worker_config(ident, settings.versions, settings.max_support,
                           loaded.max_positions)
    metrics = Metrics("worker", {"draft": loaded.draft_id, "variant": loaded.engine.variant,
                                 "target": loaded.target_id,
                                 "wire_versions": ",".join(map(str, settings.versions))})
    metrics.speculation.info({"mode": settings.speculation})
    log.info("drafter %s loaded in %.1f s", loaded.draft_id, loaded.load_seconds)
    return config, loaded.engine, metrics


def default_proposer(model) -> Proposer:
    """The production Proposer: the toy chain, or the engine seam for a real drafter."""
    return EngineProposer(model) if isinstance(model, Drafter) else Proposer(model)


async def serve(settings: WorkerSettings, stop: asyncio.Event, ready=None, *,
                proposer: Callable[[DraftModel], Proposer] = default_proposer) -> int:
    """Run until ``stop`` is set. ``ready(port, metrics_port)`` is called once listening.
    ``proposer(model)``: what a STEP's rows are (Proposer; a planted-bug test passes its
    own)."""
    warm_up_checks(settings, "worker")
    config, drafter, metrics = build(settings)
    proposal = proposer(drafter)
    proposal.limit_memory(settings.draft_kv_budget_bytes, metrics.draft_kv_evictions.inc)
    host, port = parse_hostport(settings.listen)
    sessions = SessionTable(settings.peer_bounds)  # every connection, bounded

    def accept() -> WorkerConnection:
        return WorkerConnection(config, sessions, proposal, metrics,
                                check_outgoing=settings.check_outgoing)

    tls_context = tls.server_context(settings, metrics)  # None: plain TCP
    # draws are the verifier's (pp1q.core.drawkey): a worker never knows their secret
    cap = open_capture(settings.capture, "worker", {
        "listen": settings.listen, "draw_key": {"id": DRAW_KEY_ID, "fingerprint": None}},
        settings.capture_max_bytes)
    try:  # the tap sits inside TLS: it records the plaintext frames
        server = await asyncio.get_running_loop().create_server(
            tap(accept, cap), host, port, **tls.serve_kwargs(tls_context))
    except BaseException as e:
        if cap is not None:
            cap.close()
        if isinstance(e, OSError):  # in use, not an address of this machine, ...
            raise cannot_listen("listen", settings.listen, e) from None
        raise
    port = server.sockets[0].getsockname()[1]
    try:
        log.info("worker on %s:%d: %s (%s), speculation %s (wire versions %s), %s", host,
                 port, drafter.identity, drafter.variant, settings.speculation,
                 ",".join(map(str, settings.versions)) or "none: every verifier refused",
                 "mutual TLS" if tls_context else "plain TCP")
        banner = f"pp1q worker listening on {host}:{port}"
        await serve_until_stopped(metrics, settings, banner, port, stop, ready)
    finally:
        server.close()
        open_conns = sessions.owners()
        for conn in open_conns:  # verifiers see the close and fail over at once
            conn.close()
        log.info("stopping: listening no more; closed %d verifier connection(s)",
                 len(open_conns))
        if cap is not None:
            cap.close()  # connections still open are recorded as closed by the capture
    return 0
