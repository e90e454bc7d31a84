"""KernelDecider: the service's Decider, one kernel call per loop tick's sampled rounds.

Each ``decide_round`` writes its request's target rows into the slot's buffer
(pp1q.verifier.target_rows, as LocalDecider does) and queues the round; the first round
queued in a loop tick schedules one flush (``call_soon``), which decides every queued
round of one shape in one ``KernelRounds.sampled`` call (pp1q_kernels, exact integers,
on the decider's device). The rounds of a tick are the proposals that became ready
together: the link hands out every ProposalReady of one read in one tick.

If a batch fails (a target row refused), each of its rounds is decided alone, so an
error reaches only the request whose rows caused it. Greedy rounds (argmax) and
target-only steps go through LocalDecider, one request at a time: they are exact already
and the target-only pick is the same kernel (pp1q.verifier.rounds).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pp1q.core.drawkey import DrawKeys
from pp1q.core.outcomes import StepKind
from pp1q.core.q import DyadicRow
from pp1q.core.verify import RoundKeys
from pp1q.models.toy import TargetModel
from pp1q.verifier.decider import LocalDecider
from pp1q.verifier.job import Job
from pp1q.verifier.kernel_rounds import KernelRounds
from pp1q.verifier.rounds import Outcome
from pp1q.wire import Step
from pp1q.wire.events import ProposalReady


@dataclass(frozen=True)
class _Queued:
    p: np.ndarray  # [D+1, V]: a view of the slot's buffer, read by the flush
    q_rows: Sequence[DyadicRow]
    drafts: list[int]
    keys: RoundKeys
    done: asyncio.Future


class KernelDecider(LocalDecider):
    def __init__(self, target: TargetModel, *, slots: int, depth: int, draws: DrawKeys,
                 target_delay_s: float = 0.0, device: str = "cpu") -> None:
        super().__init__(target, slots=slots, depth=depth, draws=draws,
                         target_delay_s=target_delay_s)
        self.kernel = KernelRounds(device)
        self._queued: list[_Queued] = []

    async def decide_round(self, job: Job, step: Step,
                           ready: ProposalReady) -> tuple[Outcome, StepKind]:
        if ready.greedy:
            return await super().decide_round(job, step, ready)
        await self._forward()
        drafts = list(ready.draft_ids)
        p = self.rows.rows(job.slot, job.prefix.tokens, drafts, logits=False,
                           processors=job.req.processors)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._queued.append(_Queued(p, ready.q_rows, drafts, self.round_keys(job, step), done))
        if len(self._queued) == 1:
            loop.call_soon(self._flush)
        return await done, StepKind.SPECULATIVE

    def _flush(self) -> None:
        # a cancelled round is skipped: its slot (and buffer) may already be someone else's
        queued = [r for r in self._queued if not r.done.done()]
        self._queued = []
        groups: dict[tuple, list[_Queued]] = {}
        for r in queued:
            groups.setdefault(r.p.shape, []).append(r)
        for batch in groups.values():
            try:
                self._decide(batch)
            except Exception:  # noqa: BLE001 - retried alone: each error to its own round
                for r in batch:
                    try:
                        self._decide([r])
                    except Exception as e:  # noqa: BLE001 - handed to the awaiting round
                        r.done.set_exception(e)

    def _decide(self, batch: list[_Queued]) -> None:
        outs = self.kernel.sampled([r.p for r in batch], [r.q_rows for r in batch],
                                   [r.drafts for r in batch], [r.keys for r in batch])
        for r, out in zip(batch, outs, strict=True):
            r.done.set_result(out)
