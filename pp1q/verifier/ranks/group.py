"""Rank 0 of a verifier rank group: the scheduler's decisions, made across ranks.

Rank 0 owns the worker connection and validates every byte (as one process does).
``RankedScheduler`` then hands each decision to the group as an op instead of making
it locally: OPEN when a request takes a slot, ROUND with the validated draft ids and q
rows (replicated q: every rank receives them), TARGET_ONLY for a target-only step,
INVALIDATE after a discarded proposal (RESET sent), CLOSE when the slot is released.
The op's decider (rank ``slot % world``: requests are spread over the ranks that
sample) computes the target rows and decides once; every rank commits that decision
or none does (pp1q.verifier.ranks.ops). Only then does rank 0 send COMMIT to the worker
and extend the request's tokens.

``RankGroup`` runs the exchanges from one thread: ops submitted in the meantime leave
together (one per slot per exchange), and an idle group exchanges a heartbeat every
quarter of ``rank_timeout_s``, so a dead or hung rank is found even without traffic.

Failure rule (docs/operations.md, "Ranks"): a rank that refuses an op (its committed
state differs, a stale generation, an invalid row) fails that request with HTTP 500
``rank_disagreement``, counted in ``pp1q_rank_failures_total``; the group stays up.
A collective that fails or times out loses the group: every open request fails with
HTTP 503 ``ranks_lost``, new ones are refused, and after ``rank_exit_grace_s`` every
surviving rank exits with status 3 (EXIT_RANKS_LOST) for its supervisor to restart.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading

import numpy as np

from pp1q.core.errors import Reason
from pp1q.runtime.metrics import Metrics, RankFailure, StepKind
from pp1q.runtime.settings import VerifierSettings
from pp1q.verifier import rounds
from pp1q.verifier.http import HttpError
from pp1q.verifier.ranks.collective import Collective, GroupError
from pp1q.verifier.ranks.ops import FLAG_STOP, MAX_BATCH_OPS, Form, Op, OpKind, Verdict
from pp1q.verifier.ranks.replica import RankState
from pp1q.verifier.scheduler import Job, Scheduler
from pp1q.wire import Step
from pp1q.wire.events import ProposalReady

log = logging.getLogger("pp1q.verifier.ranks.group")

EXIT_RANKS_LOST = 3  # a rank died or hung: the whole group exits for a restart
HEARTBEAT_FRACTION = 0.25  # idle exchanges this often (of rank_timeout_s): well inside it
STOP_TIMEOUT_S = 10.0  # the STOP exchange at shutdown; past it the group is abandoned


class GroupLostError(Exception):
    def __init__(self, cause: RankFailure, detail: str) -> None:
        super().__init__(detail)
        self.cause, self.detail = cause, detail


class OpRefusedError(Exception):
    def __init__(self, verdict: Verdict) -> None:
        super().__init__(f"rank {verdict.rank} refused: {verdict.reason}")
        self.verdict = verdict


class RankGroup:
    """Rank 0's side of the exchanges: a queue of ops, one thread, futures on the loop."""

    def __init__(self, coll: Collective, state: RankState, metrics: Metrics,
                 rank_timeout_s: float) -> None:
        self.coll, self.state, self.metrics = coll, state, metrics
        self.world = coll.world
        self.heartbeat_s = rank_timeout_s * HEARTBEAT_FRACTION
        self.lost: GroupLostError | None = None
        self.on_lost = None  # callback(GroupLostError) on the loop, set by the daemon
        self.peers: list[dict] = []  # identity records of every rank (healthz)
        self.children = None  # rank_launch.Children when rank 0 spawned the others
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
        self._thread = threading.Thread(target=self._run, name="pp1q-ranks", daemon=True)
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
                decided = self.state.decided
                _, verdicts, _ = self.coll.exchange(self.state, self._seq,
                                                    [op for op, _ in batch],
                                                    FLAG_STOP if stop else 0)
                self.metrics.rank_exchanges.inc()
                self.metrics.rank_decisions.inc(self.state.decided - decided)
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
            if not v.ok:  # counted once per failed request, where it fails (_run)
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


def _quiet(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()  # counted and logged by RankGroup already


class RankedScheduler(Scheduler):
    """The scheduler of rank 0: every decision goes through the rank group."""

    group: RankGroup  # set once the group has formed (pp1q.verifier.daemon)

    def decider(self, slot: int) -> int:
        return slot % self.group.world

    def _op(self, job: Job, kind: OpKind, **fields) -> Op:
        return Op(kind, job.slot, seed=job.req.seed, decider=self.decider(job.slot),
                  prefix_len=len(job.prefix), prefix_digest=job.prefix.digest, **fields)

    async def _run(self, op: Op) -> Verdict:
        try:
            return await self.group.submit(op)
        except GroupLostError as e:
            raise HttpError(503, "ranks_lost",
                            f"a verifier rank failed ({e.cause.value}); restarting") from None
        except OpRefusedError as e:
            why = e.verdict.reason
            cause = (RankFailure.DIGEST_MISMATCH if why is Reason.CHECKSUM_MISMATCH
                     else RankFailure.RANK_REFUSED)
            self.metrics.rank_failures.labels(cause=cause.value).inc()
            raise HttpError(500, "rank_disagreement",
                            f"rank {e.verdict.rank} refused {op.kind.name.lower()} "
                            f"({e.verdict.reason}); nothing was committed") from None

    def _submit_unawaited(self, op: Op) -> None:
        """OPEN and CLOSE: later ops of the slot queue behind them (FIFO), and after a
        refused OPEN the request's first decision is refused too (the slot is open on no
        rank), so nobody waits for their votes; CLOSE is never refused."""
        self.group.submit(op).add_done_callback(_quiet)

    async def _job_started(self, job: Job) -> None:
        if self.group.lost is not None:
            raise HttpError(503, "ranks_lost", "the verifier rank group is down; restarting")
        self._submit_unawaited(self._op(job, OpKind.OPEN, greedy=job.req.greedy,
                                        prompt=np.asarray(job.req.prompt, dtype=np.int32)))

    def _release(self, job: Job) -> None:
        if self.group.lost is None:
            self._submit_unawaited(self._op(job, OpKind.CLOSE))  # queued before any reuse
        super()._release(job)

    async def _decide_round(self, job: Job, step: Step,
                            ready: ProposalReady) -> tuple[rounds.Outcome, StepKind]:
        rows = () if ready.greedy else tuple(
            (Form.DENSE, None, r.q) if r.ids is None else (Form.SPARSE, r.ids, r.q)
            for r in ready.replies)
        # rank 0 deciding uses the rows it validated; any other decider parses the bytes
        mine = not ready.greedy and self.decider(job.slot) == 0
        op = self._op(job, OpKind.ROUND, generation=step.generation, round_id=step.round_id,
                      greedy=ready.greedy, drafts=np.asarray(ready.draft_ids, np.int32),
                      rows=rows, q_rows=tuple(ready.q_rows) if mine else None)
        v = await self._run(op)
        kind = StepKind.GREEDY if ready.greedy else StepKind.SPECULATIVE
        return rounds.Outcome(v.accepted, v.token), kind

    async def _decide_target_only(self, job: Job, generation: int,
                                  round_id: int) -> rounds.Outcome:
        v = await self._run(self._op(job, OpKind.TARGET_ONLY, generation=generation,
                                     round_id=round_id))
        return rounds.Outcome(0, v.token)

    async def _invalidated(self, job: Job, generation: int, reason: Reason) -> None:
        if job.context_session is None:
            return  # no proposal of this generation was ever possible: nothing to kill
        await self._run(self._op(job, OpKind.INVALIDATE, generation=generation,
                                 reason=reason))

    def health(self) -> dict:
        g = self.group
        return {"world": g.world, "state": "lost" if g.lost else "up",
                "metrics": [p.get("metrics") for p in g.peers]}


async def start_group(settings: VerifierSettings, launch, scheduler: RankedScheduler, config,
                      stop: asyncio.Event, state_cls=None) -> RankGroup | None:
    """Rank 0: form the group (``launch``: pp1q.verifier.ranks.launch.Launch), start the
    exchange thread; None when the ranks did not all join within the join timeout."""
    from pp1q.verifier.ranks.launch import form_group, identity, limits_of

    rv = launch.plan.rv
    limits = limits_of(config, rv.world)
    record = identity(scheduler.target.identity, limits, rv.backend, None)
    try:
        coll, records = await form_group(launch, limits, record, stop)
    except TimeoutError as e:
        log.error("%s", e)
        return None
    metrics = scheduler.metrics
    metrics.rank_world_size.set(rv.world)
    state = (state_cls or RankState)(0, limits, scheduler.target, scheduler.target_delay_s)
    group = RankGroup(coll, state, metrics, settings.rank_timeout_s)
    group.peers, group.children = records, launch.children
    loop = asyncio.get_running_loop()
    grace = settings.rank_exit_grace_s
    group.on_lost = lambda _lost: loop.call_later(grace, stop.set)
    scheduler.group = group
    group.start()
    log.info("verifier rank group of %d formed (%s)", rv.world, rv.backend)
    return group
