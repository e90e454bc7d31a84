"""KernelDecider: the toy models' Decider, one kernel call per loop tick's sampled rounds.

Each ``decide_round`` writes its request's target rows into the slot's buffer
(pp1q.verifier.target_rows, as LocalDecider does) and hands the round to its
``RoundBatch`` (pp1q.verifier.round_batch): the sampled rounds of one loop tick are
decided in one ``KernelRounds.sampled`` call (pp1q_kernels, exact integers, on the
decider's device), an error reaching only the round whose rows caused it. Greedy rounds
(argmax) and target-only steps go through LocalDecider, one request at a time: they are
exact already and the target-only pick is the same kernel (pp1q.verifier.rounds).
"""

from __future__ import annotations

from pp1q.core.drawkey import DrawKeys
from pp1q.core.outcomes import StepKind
from pp1q.models.toy import TargetModel
from pp1q.verifier.decider import LocalDecider
from pp1q.verifier.job import Job
from pp1q.verifier.kernel_rounds import KernelRounds
from pp1q.verifier.round_batch import RoundBatch
from pp1q.verifier.rounds import Outcome
from pp1q.wire import Step
from pp1q.wire.events import ProposalReady


class KernelDecider(LocalDecider):
    def __init__(self, target: TargetModel, *, slots: int, depth: int, draws: DrawKeys,
                 target_delay_s: float = 0.0, device: str = "cpu") -> None:
        super().__init__(target, slots=slots, depth=depth, draws=draws,
                         target_delay_s=target_delay_s)
        self.kernel = KernelRounds(device)
        self.batch = RoundBatch(self.kernel)

    async def decide_round(self, job: Job, step: Step,
                           ready: ProposalReady) -> tuple[Outcome, StepKind]:
        if ready.greedy:
            return await super().decide_round(job, step, ready)
        await self._forward()
        drafts = list(ready.draft_ids)
        p = self.rows.rows(job.slot, job.prefix.tokens, drafts, logits=False,
                           processors=job.req.processors)
        out = await self.batch.decide(p, ready.q_rows, drafts, self.round_keys(job, step))
        return out, StepKind.SPECULATIVE
