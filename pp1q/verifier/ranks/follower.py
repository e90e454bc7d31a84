"""Verifier ranks 1..N-1: follow rank 0's exchanges, hold the replica, decide owned slots.

A follower has no worker connection and no HTTP API; it serves its own /metrics. It
joins the group, then takes part in every exchange rank 0 starts
(pp1q.verifier.ranks.collective) until rank 0 stops the group (exit 0), the group is
lost (exit 3, at once: a rank died, hung past ``rank_timeout_s`` or desynchronised;
its supervisor restarts it with the others), or it is told to stop itself (SIGTERM:
exit 0, and rank 0 sees a lost rank). Exchanges run in one thread; the event loop only
keeps the signals.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from pp1q.core.outcomes import RankFailure
from pp1q.models.engine import make_current
from pp1q.runtime.metrics import Metrics
from pp1q.runtime.settings import VerifierSettings
from pp1q.verifier.ranks.collective import GroupError
from pp1q.verifier.ranks.group import EXIT_RANKS_LOST
from pp1q.verifier.ranks.launch import (
    RankPlan,
    check_identities,
    identity,
    join,
    share_draw_secret,
)
from pp1q.verifier.ranks.ops import FLAG_STOP, Limits
from pp1q.verifier.ranks.replica import RankDecisions, RankState
from pp1q.verifier.ranks.sharded import sharded_state

log = logging.getLogger("pp1q.verifier.ranks.group")


def follow(plan: RankPlan, state: RankState, metrics: Metrics, record: dict,
           stop: threading.Event, announce, device=None) -> int:
    """Blocking: join, then exchanges until the group stops or fails. Exit status.
    ``device``: the target's, made this thread's current one (None: a host model)."""
    rv = plan.rv
    try:
        coll, records = join(rv, state.limits, None, record)
    except Exception as e:  # noqa: BLE001 - torch raises several types when joining fails
        log.error("rank %d could not join the group: %s", rv.rank, e)
        return EXIT_RANKS_LOST
    # after the join, which under nccl made cuda:LOCAL_RANK current in this thread (the
    # same GPU for device = cuda); rank 0's exchange thread does the same (RankGroup)
    make_current(device)
    check_identities(records)  # ConfigError: exit status 2, on every rank alike
    state.decisions.draws = share_draw_secret(records)
    state.joined(coll)
    announce()
    seq = 0
    try:
        while True:
            seq += 1
            decided, invalidated = state.decided, state.invalidations
            evicted = state.decisions.evictions
            _, _, flags = coll.exchange(state, seq)  # (timed on rank 0: here it waits too)
            metrics.rank_exchanges.inc()
            metrics.rank_decisions.inc(state.decided - decided)
            metrics.generation_invalidations.inc(state.invalidations - invalidated)
            metrics.rank_kv_evictions.inc(state.decisions.evictions - evicted)
            if flags & FLAG_STOP:
                coll.close()
                log.info("rank %d: the group stopped", rv.rank)
                return 0
            if stop.is_set():
                log.warning("rank %d leaves the group (stopped); rank 0 will see it lost",
                            rv.rank)
                return 0
    except GroupError as e:
        cause = RankFailure.RANK_TIMEOUT if e.timed_out else RankFailure.RANK_LOST
        metrics.rank_failures.labels(cause=cause.value).inc()
        log.error("rank %d lost the group (%s): %s", rv.rank, cause.value, e.detail)
        return EXIT_RANKS_LOST
    except Exception:  # a bug: leave the group the way a crash would, but say why
        log.exception("rank %d: exchange failed", rv.rank)
        return EXIT_RANKS_LOST


async def serve_follower(settings: VerifierSettings, plan: RankPlan, limits: Limits, target,
                         metrics: Metrics, stop: asyncio.Event,
                         decisions: Callable[..., RankDecisions] = RankDecisions) -> int:
    """A follower daemon's life, from the event loop of pp1q.cli._daemon. ``decisions``
    builds the replica's decisions (pp1q.verifier.daemon.Deciders.rank)."""
    rv = plan.rv
    delay_s = settings.target_delay_ms / 1000.0
    if limits.sharded:  # every rank decides every op from its vocabulary shard
        state = sharded_state(rv.rank, limits, target, delay_s)
    else:
        state = RankState(rv.rank, limits, decisions(target, limits), delay_s)
    host = settings.metrics_host
    with metrics.served(host, settings.metrics_port) as mport:
        record = identity(target, limits, rv.backend,
                          f"{host}:{mport}" if mport else None)
        where = f"{rv.master[0]}:{rv.master[1]}" if rv.master else "env://"

        def announce() -> None:
            print(f"pp1q verifier rank {rv.rank}/{rv.world} joined {where}"
                  + (f", metrics on {host}:{mport}" if mport else ""), flush=True)

        flag = threading.Event()
        watcher = asyncio.get_running_loop().create_task(stop.wait())
        watcher.add_done_callback(lambda _t: flag.set())
        try:
            # toy targets are numpy on the host: no device
            return await asyncio.to_thread(follow, plan, state, metrics, record, flag,
                                           announce, getattr(target, "device", None))
        finally:
            watcher.cancel()
