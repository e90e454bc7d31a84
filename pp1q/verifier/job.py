"""One request's state while it holds a slot (the scheduler's and the deciders' view)."""

from __future__ import annotations

from pp1q.core.prefix import Prefix
from pp1q.verifier.api import GenerateRequest, RequestStats

TARGET_ONLY_GENERATION = 0  # speculative rounds use generations >= 1 on every slot


class Job:
    """A request in its slot: committed prefix, tokens produced, generation, round ids."""

    def __init__(self, req: GenerateRequest, slot: int) -> None:
        self.req, self.slot = req, slot
        self.prefix = Prefix(req.prompt)
        self.produced = 0
        self.stopped = False  # a stop id (EOS or stop_token_ids) was committed
        self.stats = RequestStats()
        self.generation = TARGET_ONLY_GENERATION
        self.round_id = 0
        self.context_session: int | None = None  # session whose worker holds our context
        self.worker_holds = 0  # committed tokens the worker holds under context_session
        self.stepped = False  # a STEP of this generation went out: a proposal was possible

    def next_round(self) -> int:
        self.round_id += 1
        return self.round_id
