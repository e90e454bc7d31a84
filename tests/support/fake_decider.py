"""A trivial Decider for scheduler tests: accepts every draft, then BONUS; target-only
steps give ALONE; every call logged."""

from __future__ import annotations

from pp1q.core.errors import Reason, ServiceError
from pp1q.core.outcomes import StepKind
from pp1q.verifier.decider import Decider
from pp1q.verifier.rounds import Outcome

BONUS = 11  # the fake decider's token after accepted drafts
ALONE = 7  # the fake decider's target-only token


class FakeDecider(Decider):
    """Accepts every draft, then BONUS; target-only steps give ALONE. Logs each call."""

    def __init__(self, fail_open: Reason | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail_open = fail_open

    async def open(self, job):
        self.calls.append(("open", job.slot))
        if self.fail_open is not None:
            raise ServiceError(self.fail_open, "the fake says no")

    async def decide_round(self, job, step, ready):
        self.calls.append(("round", step.generation, step.round_id, tuple(ready.draft_ids)))
        return Outcome(len(ready.draft_ids), BONUS), StepKind.GREEDY

    async def decide_target_only(self, job, generation, round_id):
        self.calls.append(("target_only", generation, round_id))
        return Outcome(0, ALONE)

    async def invalidate(self, job, generation, reason):
        self.calls.append(("invalidate", generation, reason))

    def close(self, job):
        self.calls.append(("close", job.slot))
