"""Rank 0's Decider: every decision of the scheduler made by the rank group.

Each call becomes an op for the group (pp1q.verifier.ranks.group): OPEN when a request
takes a slot (its prompt, seed and target processors), ROUND with the validated draft
ids and q rows (replicated q: every rank receives them), TARGET_ONLY for a target-only
step, INVALIDATE after a discarded proposal (a STEP of that generation went out), CLOSE
when the slot is released; a real model's shards (--shard-vocab) also get PREFILL
ops after OPEN, each bringing the slot's K/V one chunk further into the prompt. The
op's decider (rank ``slot % world``: requests are spread over the ranks that sample)
decides once through its replica's RankDecisions (replicated
ranks; with --shard-vocab every rank takes part, pp1q.verifier.ranks.sharded); every
rank commits that decision or none does. A lost group or a refused op is a
ServiceError (RANKS_LOST, RANK_DISAGREEMENT): the HTTP layer answers 503 ``ranks_lost``
/ 500 ``rank_disagreement``.

A prompt is prefilled in chunks, as EngineDecider does with one process: ``open`` sends
one PREFILL op per ``prefill_chunk`` ids of the prompt (the boundary in the op, so every
rank holds the same prefix) and awaits each before the next, so the group's exchanges
(one op per slot each) carry other slots' rounds between two chunks instead of holding
them behind the whole prompt (a 4,096-id prompt is ~20 s of SmolLM2-135M on the 2-core
CPU), and a request whose client leaves stops after the op in hand (its CLOSE queues
behind it). The first round feeds the rest, at most one chunk, with its drafts. Only a
real model's shards keep K/V: a toy group (replicated or sharded) gets no PREFILL op,
which would cost an exchange each and do nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import Reason, ServiceError
from pp1q.core.outcomes import RankFailure, StepKind
from pp1q.models.toy import TargetModel
from pp1q.runtime.metrics import Metrics
from pp1q.verifier.decider import Decider
from pp1q.verifier.job import Job
from pp1q.verifier.ranks.group import GroupLostError, OpRefusedError, RankGroup
from pp1q.verifier.ranks.ops import Form, Limits, Op, OpKind
from pp1q.verifier.ranks.replica import RankDecisions
from pp1q.verifier.ranks.votes import Verdict
from pp1q.verifier.rounds import Outcome
from pp1q.wire import Step
from pp1q.wire.events import ProposalReady


def _quiet(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()  # counted and logged by RankGroup already


class RankedDecider(Decider):
    """Decisions across the rank group; ``group`` is set once it has formed
    (pp1q.verifier.ranks.group.start_group, which builds rank 0's replica with
    ``decisions``)."""

    def __init__(self, target: TargetModel, metrics: Metrics, draws: DrawKeys,
                 target_delay_s: float = 0.0,
                 decisions: Callable[[TargetModel, Limits], RankDecisions] = RankDecisions,
                 sharded: bool = False, prefill_chunk: int | None = None) -> None:
        """``prefill_chunk``: the prompt ids one PREFILL op adds to the ranks' K/V (at
        most PREFILL_CHUNK: each rank refuses more); None for targets with no cache."""
        self.target, self.metrics = target, metrics
        self.draws = draws  # handed to every rank at join (start_group), never in an op
        self.target_delay_s = target_delay_s
        self.decisions = decisions
        self.sharded = sharded  # --shard-vocab: dense rows are scattered, not broadcast
        self.prefill_chunk = prefill_chunk
        self.group: RankGroup | None = None

    def decider_rank(self, slot: int) -> int:
        return slot % self.group.world

    def _op(self, job: Job, kind: OpKind, **fields) -> Op:
        return Op(kind, job.slot, seed=job.req.seed, decider=self.decider_rank(job.slot),
                  prefix_len=len(job.prefix), prefix_digest=job.prefix.digest, **fields)

    async def _run(self, op: Op) -> Verdict:
        try:
            return await self.group.submit(op)
        except GroupLostError as e:
            raise ServiceError(Reason.RANKS_LOST, f"a verifier rank failed ({e.cause.value}); "
                                                  "restarting") from None
        except OpRefusedError as e:
            why = e.verdict.reason
            cause = (RankFailure.DIGEST_MISMATCH if why is Reason.CHECKSUM_MISMATCH
                     else RankFailure.RANK_REFUSED)
            self.metrics.rank_failures.labels(cause=cause.value).inc()
            raise ServiceError(Reason.RANK_DISAGREEMENT,
                               f"rank {e.verdict.rank} refused {op.kind.name.lower()} "
                               f"({e.verdict.reason}); nothing was committed") from None

    def _submit_unawaited(self, op: Op) -> None:
        """OPEN and CLOSE: later ops of the slot queue behind them (FIFO), and after a
        refused OPEN the request's first decision is refused too (the slot is open on no
        rank), so nobody waits for their votes; CLOSE is never refused."""
        self.group.submit(op).add_done_callback(_quiet)

    async def open(self, job: Job) -> None:
        if self.group.lost is not None:
            raise ServiceError(Reason.RANKS_LOST, "the verifier rank group is down; restarting")
        self._submit_unawaited(self._op(job, OpKind.OPEN, greedy=job.req.greedy,
                                        prompt=np.asarray(job.req.prompt, dtype=np.int32),
                                        processors=job.req.processors))
        if not self.prefill_chunk:
            return
        # the prompt but its last chunk (at most prefill_chunk ids, fed by the first
        # round with its drafts); each awaited: a cancellation stops after the op in hand
        for upto in range(self.prefill_chunk, len(job.prefix), self.prefill_chunk):
            await self._run(self._op(job, OpKind.PREFILL, upto=upto))

    def close(self, job: Job) -> None:
        if self.group.lost is None:
            self._submit_unawaited(self._op(job, OpKind.CLOSE))  # queued before any reuse

    async def decide_round(self, job: Job, step: Step,
                           ready: ProposalReady) -> tuple[Outcome, StepKind]:
        dense = Form.SHARDED if self.sharded else Form.DENSE
        rows = () if ready.greedy else tuple(
            (dense, None, r.q) if r.ids is None else (Form.SPARSE, r.ids, r.q)
            for r in ready.replies)
        # rank 0 deciding (or scattering dense slices) uses the rows it validated; any
        # other decider parses the bytes
        mine = not ready.greedy and (self.sharded or self.decider_rank(job.slot) == 0)
        op = self._op(job, OpKind.ROUND, generation=step.generation, round_id=step.round_id,
                      greedy=ready.greedy, drafts=np.asarray(ready.draft_ids, np.int32),
                      rows=rows, q_rows=tuple(ready.q_rows) if mine else None)
        v = await self._run(op)
        kind = StepKind.GREEDY if ready.greedy else StepKind.SPECULATIVE
        return Outcome(v.accepted, v.token), kind

    async def decide_target_only(self, job: Job, generation: int, round_id: int) -> Outcome:
        v = await self._run(self._op(job, OpKind.TARGET_ONLY, generation=generation,
                                     round_id=round_id))
        return Outcome(0, v.token)

    async def invalidate(self, job: Job, generation: int, reason: Reason) -> None:
        await self._run(self._op(job, OpKind.INVALIDATE, generation=generation,
                                 reason=reason))

    def health(self) -> dict:
        g = self.group
        return {"world": g.world, "state": "lost" if g.lost else "up",
                "metrics": [g.metrics_at, *(p.get("metrics") for p in g.peers[1:])]}
