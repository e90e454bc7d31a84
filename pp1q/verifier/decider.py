"""The verifier's one decision seam: the scheduler hands a round to a Decider.

The scheduler (pp1q.verifier.scheduler) owns slots, generations, the worker link and
the fallback rule; a ``Decider`` owns the target and the decision. Implementations:
``LocalDecider`` here (one process: target rows into the slot's preallocated buffer,
then pp1q.verifier.rounds, one request at a time), ``KernelDecider``
(pp1q.verifier.kernel_decider: the toy's production one, LocalDecider with the sampled
rounds of one loop tick decided in one pp1q_kernels call), ``EngineDecider``
(pp1q.verifier.engine_decider: a real model's, its Target scoring the queued requests in
one forward and their sampled rounds decided in one call), ``RankedDecider``
(pp1q.verifier.ranks.decider: the same decision made by the op's deciding rank,
committed by every rank or none). A planted-bug test injects its own Decider the way
the daemon injects the production one (pp1q.verifier.daemon.Deciders).

Calls per request, in order: ``open`` once when the request takes its slot, then any
number of ``decide_round`` / ``decide_target_only`` / ``invalidate``, then ``close``
once when the slot is released (also after an error or a cancellation). A decider
raises ``pp1q.core.errors.ServiceError`` when it cannot decide (ranks lost, a rank
refused); it never picks an HTTP status.
"""

from __future__ import annotations

import abc
import asyncio

from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import Reason
from pp1q.core.outcomes import StepKind
from pp1q.core.verify import RoundKeys
from pp1q.models.toy import TargetModel
from pp1q.verifier.job import Job
from pp1q.verifier.rounds import Outcome
from pp1q.verifier.target_rows import TargetRows
from pp1q.wire import Step
from pp1q.wire.events import ProposalReady


class Decider(abc.ABC):
    # the keys of this decider's draws (pp1q.core.drawkey): a capture names their
    # fingerprint; every production decider has them
    draws: DrawKeys | None = None

    async def open(self, job: Job) -> None:  # noqa: B027 - optional, empty by default
        """``job`` took its slot; no decision of it has been asked yet."""

    @abc.abstractmethod
    async def decide_round(self, job: Job, step: Step,
                           ready: ProposalReady) -> tuple[Outcome, StepKind]:
        """Decide a validated proposal of ``step`` after the job's committed prefix:
        (accepted drafts and the next token, SPECULATIVE or GREEDY)."""

    @abc.abstractmethod
    async def decide_target_only(self, job: Job, generation: int, round_id: int) -> Outcome:
        """One token from the target alone after the job's committed prefix, keyed by
        (the verifier's draw seed, ``generation``, ``round_id``, position)."""

    async def invalidate(self, job: Job, generation: int,  # noqa: B027
                         reason: Reason) -> None:
        """No proposal of ``generation`` on the job's slot is decided again (called
        before the fallback step when a STEP of that generation went out, after its
        RESET if the link could send one)."""

    def close(self, job: Job) -> None:  # noqa: B027 - optional, empty by default
        """The job released its slot. Must not block: it runs while the request
        unwinds, after an error or a cancellation too."""

    def health(self) -> dict | None:
        """Extra state for /healthz (None: nothing to report); a dict whose ``state``
        is not ``up`` makes /healthz answer 503."""
        return None


class LocalDecider(Decider):
    """Decisions in this process (today's path with one verifier rank). Its draws are
    keyed by ``draws`` (pp1q.core.drawkey): a seed the worker cannot compute."""

    def __init__(self, target: TargetModel, *, slots: int, depth: int, draws: DrawKeys,
                 target_delay_s: float = 0.0) -> None:
        self.target = target
        self.draws = draws
        self.rows = TargetRows(target, slots, depth)
        self.target_delay_s = target_delay_s

    def round_keys(self, job: Job, step: Step) -> RoundKeys:
        """The keys of a speculative round's draws (every local decider takes them here)."""
        return RoundKeys(self.draws.seed_for(job.req.seed), step.generation, step.round_id,
                         step.first_position)

    async def _forward(self) -> None:
        if self.target_delay_s:
            await asyncio.sleep(self.target_delay_s)  # simulated forward-pass latency

    async def decide_round(self, job: Job, step: Step,
                           ready: ProposalReady) -> tuple[Outcome, StepKind]:
        await self._forward()
        out = self.rows.round(job.slot, job.prefix.tokens, list(ready.draft_ids),
                              ready.q_rows, self.round_keys(job, step), ready.greedy,
                              job.req.processors)
        return out, StepKind.GREEDY if ready.greedy else StepKind.SPECULATIVE

    async def decide_target_only(self, job: Job, generation: int, round_id: int) -> Outcome:
        await self._forward()
        return self.rows.target_only(job.slot, job.prefix.tokens,
                                     self.draws.seed_for(job.req.seed), generation, round_id,
                                     job.req.greedy, job.req.processors)
