"""Rank 0 of a verifier rank group: the exchanges that make decisions across ranks.

Rank 0 owns the worker connection and validates every byte (as one process does).
Its Decider (pp1q.verifier.ranks.decider.RankedDecider) then hands each decision to
the group as an op instead of making it locally: OPEN when a request takes a slot, ROUND
with the validated draft ids and q rows (replicated q: every rank receives them),
TARGET_ONLY for a target-only step, INVALIDATE after a discarded proposal (a STEP of
that generation went out), CLOSE when the slot is released. The op's decider (rank
``slot % world``: requests are spread over the ranks that sample) computes the target
rows and decides once (replicated ranks; with --shard-vocab every rank takes part in
every decision, pp1q.verifier.ranks.sharded); every rank commits that decision or none
does (pp1q.verifier.ranks.votes). Only then does rank 0 send COMMIT to the worker and
extend the request's tokens.

``RankGroup`` runs the exchanges from one thread: ops submitted in the meantime leave
together (one per slot per exchange), and an idle group exchanges a heartbeat every
quarter of ``rank_timeout_s``, so a dead or hung rank is found even without traffic.

Failure rule (docs/operations.md, "Ranks"): a rank that refuses an op (its committed
state differs, a stale generation, an invalid row) fails that request with HTTP 500
``rank_disagreement``, counted in ``pp1q_rank_failures_total``; the group stays up. A
collective that fails or times out loses the group: every open request fails with HTTP
503 ``ranks_lost``, new ones are refused, and rank 0 exits with status 3
(EXIT_RANKS_LOST) after ``rank_exit_grace_s``, every other surviving rank at once, for
their supervisors to restart.
The decider raises these as ServiceError (RANK_DISAGREEMENT, RANKS_LOST); the HTTP
layer picks the status (pp1q.verifier.http.STATUS_OF).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time

from pp1q.core.errors import Pp1qError, Reason
from pp1q.core.outcomes import RankFailure
from pp1q.models.engine import on_device
from pp1q.runtime.metrics import Metrics
from pp1q.runtime.settings import VerifierSettings
from pp1q.verifier.ranks.collective import Collective, GroupError
from pp1q.verifier.ranks.ops import FLAG_STOP, MAX_BATCH_OPS, Op
from pp1q.verifier.ranks.replica import RankState
from pp1q.verifier.ranks.votes import Verdict

log = logging.getLogger("pp1q.verifier.ranks.group")

EXIT_RANKS_LOST = 3  # a rank died or hung: the whole group exits for a restart
HEARTBEAT_FRACTION = 0.25  # idle exchanges this often (of rank_timeout_s): well inside it
STOP_TIMEOUT_S = 10.0  # the STOP exchange at shutdown; past it the group is abandoned


class GroupLostError(Pp1qError):
    """The group is gone (``cause``: how); every op waiting and every later op fails."""

    def __init__(self, cause: RankFailure, detail: str) -> None:
        super().__init__(Reason.RANKS_LOST, detail, message=detail)
        self.cause = cause


class OpRefusedError(Pp1qError):
    """A rank voted no on an op (``verdict.reason`` says why): every rank discarded it."""

    def __init__(self, verdict: Verdict) -> None:
        text = f"rank {verdict.rank} refused: {verdict.reason}"
        super().__init__(Reason.RANK_DISAGREEMENT, text, message=text)
        self.verdict = verdict


class RankGroup:
    """Rank 0's side of the exchanges: a queue of ops, one thread, futures on the loop."""

    def __init__(self, coll: Collective, state: RankState, metrics: Metrics,
                 rank_timeout_s: float, device=None) -> None:
        """``device``: the target's (the exchange thread makes it its current one; None:
        a host model)."""
        self.coll, self.state, self.metrics = coll, state, metrics
        self.device = device
        self.world = coll.world
        self.heartbeat_s = rank_timeout_s * HEARTBEAT_FRACTION
        self.lost: GroupLostError | None = None
        self.on_lost = None  # callback(GroupLostError) on the loop, set by the daemon
        self.peers: list[dict] = []  # identity records of every rank (healthz)
        # rank 0's own /metrics, bound after the group formed (its record says None)
        self.metrics_at: str | None = None
        self.children = None  # launch.Children when rank 0 spawned the others
        self._pending: collections.deque[tuple[Op, asyncio.Future]] = collections.deque()
        self._outbox: list[tuple[Op, asyncio.Future]] = []  # this loop tick's ops
        self._cv = threading.Condition()
        self._stopping = False
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=on_device, args=(self.device, self._run),
                                        name="pp1q-ranks", daemon=True)
        self._thread.start()

    def submit(self, op: Op) -> asyncio.Future:
        """Queue ``op``; ops submitted in the same loop tick reach the exchange thread
        together (as the link batches STEPs), so they can share one exchange."""
        fut = self._loop.create_future()
        if self.lost is not None:
            fut.set_exception(self.lost)
            return fut
        self._outbox.append((op, fut))
        if len(self._outbox) == 1:
            self._loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        with self._cv:
            self._pending.extend(self._outbox)
            self._cv.notify()
        self._outbox.clear()

    @property
    def exit_status(self) -> int:
        return EXIT_RANKS_LOST if self.lost is not None else 0

    async def close(self) -> None:
        """A STOP exchange (every other rank exits 0), leave the group, reap spawned ranks."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._done.wait, STOP_TIMEOUT_S)
        if self.lost is None and self._done.is_set():
            self.coll.close()
        if self.children is not None:
            await asyncio.to_thread(self.children.reap)

    # -- the exchange thread ---------------------------------------------------------

    def _take(self) -> tuple[list[tuple[Op, asyncio.Future]], bool]:
        with self._cv:
            if not self._pending and not self._stopping:
                self._cv.wait(self.heartbeat_s)
            batch, slots = [], set()
            while (self._pending and len(batch) < MAX_BATCH_OPS
                   and self._pending[0][0].slot not in slots):
                op, fut = self._pending.popleft()
                slots.add(op.slot)
                batch.append((op, fut))
            return batch, self._stopping and not self._pending

    def _run(self) -> None:
        batch: list = []
        try:
            while True:
                batch, stop = self._take()
                self._seq += 1
                decided, evicted = self.state.decided, self.state.decisions.evictions
                t0 = time.perf_counter()
                _, verdicts, _ = self.coll.exchange(self.state, self._seq,
                                                    [op for op, _ in batch],
                                                    FLAG_STOP if stop else 0)
                self.metrics.rank_exchange_seconds.observe(time.perf_counter() - t0)
                self.metrics.rank_exchanges.inc()
                self.metrics.rank_decisions.inc(self.state.decided - decided)
                self.metrics.rank_kv_evictions.inc(self.state.decisions.evictions - evicted)
                self._loop.call_soon_threadsafe(self._resolve, batch, verdicts)
                if stop:
                    return
        except GroupError as e:
            cause = RankFailure.RANK_TIMEOUT if e.timed_out else RankFailure.RANK_LOST
            self._report_loss(GroupLostError(cause, e.detail), batch)
        except Exception as e:  # noqa: BLE001 - a bug here must not leave requests waiting
            log.exception("rank exchange failed")
            self._report_loss(GroupLostError(RankFailure.RANK_LOST, f"internal: {e!r}"), batch)
        finally:
            self._done.set()

    def _report_loss(self, lost: GroupLostError, batch) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: the daemon is gone already
            self._loop.call_soon_threadsafe(self._lose, lost, batch)

    # -- on the loop -----------------------------------------------------------------

    def _resolve(self, batch, verdicts: list[Verdict]) -> None:
        for (op, fut), v in zip(batch, verdicts, strict=True):
            if not v.ok:  # counted once per failed request, where it fails (RankedDecider._run)
                log.error("rank %s refused %s of slot %d (%s); every rank discarded it",
                          v.rank, op.kind.name, op.slot, v.reason)
            if fut.done():
                continue
            if v.ok:
                fut.set_result(v)
            else:
                fut.set_exception(OpRefusedError(v))

    def _lose(self, lost: GroupLostError, batch) -> None:
        if self.lost is not None:
            return
        self.lost = lost
        self.metrics.rank_failures.labels(cause=lost.cause.value).inc()
        log.error("verifier rank group lost (%s): %s", lost.cause.value, lost.detail)
        with self._cv:
            waiting = list(self._pending) + list(batch) + self._outbox
            self._pending.clear()
            self._outbox.clear()
        for _op, fut in waiting:
            if not fut.done():
                fut.set_exception(lost)
        if self.on_lost is not None:
            self.on_lost(lost)


async def start_group(settings: VerifierSettings, launch, decider, config,
                      stop: asyncio.Event) -> RankGroup | None:
    """Rank 0: form the group (``launch``: pp1q.verifier.ranks.launch.Launch), start the
    exchange thread and hand it to ``decider`` (pp1q.verifier.ranks.decider.RankedDecider;
    not imported here: it imports this module); None when the ranks did not all join
    within the join timeout."""
    from pp1q.verifier.ranks.launch import (
        DRAW_SECRET,
        form_group,
        identity,
        limits_of,
        share_draw_secret,
    )
    from pp1q.verifier.ranks.sharded import sharded_state

    rv = launch.plan.rv
    limits = limits_of(config, rv.world, settings.shard_vocab)
    record = identity(decider.target, limits, rv.backend, None)
    record[DRAW_SECRET] = decider.draws.hex()
    try:
        coll, records = await form_group(launch, limits, record, stop)
    except TimeoutError as e:
        log.error("%s", e)
        return None
    metrics = decider.metrics
    metrics.rank_world_size.set(rv.world)
    if limits.sharded:
        state = sharded_state(0, limits, decider.target, decider.target_delay_s)
    else:
        state = RankState(0, limits, decider.decisions(decider.target, limits),
                          decider.target_delay_s)
    state.decisions.draws = share_draw_secret(records)
    state.joined(coll)
    # toy targets are numpy on the host: no device
    group = RankGroup(coll, state, metrics, settings.rank_timeout_s,
                      getattr(decider.target, "device", None))
    group.peers, group.children = records, launch.children
    loop = asyncio.get_running_loop()
    grace = settings.rank_exit_grace_s
    group.on_lost = lambda _lost: loop.call_later(grace, stop.set)
    decider.group = group
    group.start()
    log.info("verifier rank group of %d formed (%s)", rv.world, rv.backend)
    return group
