"""A worker link for the scheduler's tests, in process: it records the CONTEXTs, STEPs,
COMMITs and RESETs the scheduler sends and proposes DRAFTS for every greedy STEP (or a
Fallback from ``outcomes``, or is down)."""

from __future__ import annotations

from types import SimpleNamespace

DRAFTS = (5, 9)


class FakeLink:
    """A worker link that proposes DRAFTS for every greedy STEP (or is down)."""

    max_context = 1 << 17

    def __init__(self, ready: bool = True, outcomes=()) -> None:
        self.ready, self.session = ready, 1
        self.commits, self.resets, self.contexts = [], [], []
        self.context_generations, self.steps = [], []  # beside contexts; STEPs proposed
        self.outcomes = list(outcomes)  # Fallbacks to answer STEPs with, in turn (None: drafts)
        self.circuit = False  # True: the breaker lets no round speculate

    def send_context(self, slot, generation, prefix, start):
        self.contexts.append((start, list(prefix.tokens[start:])))
        self.context_generations.append(generation)
        return True

    async def propose(self, step):
        self.steps.append(step)
        if self.outcomes and (out := self.outcomes.pop(0)) is not None:
            return out
        return SimpleNamespace(draft_ids=DRAFTS, q_rows=(), replies=(), greedy=True)

    def commit(self, c):
        self.commits.append(c)
        return True

    def reset(self, slot, generation, reason):
        self.resets.append((slot, generation, reason))
        return True

    def circuit_open(self):
        return self.circuit
