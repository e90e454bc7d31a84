"""The worker's Proposer over an engine ``Drafter`` (pp1q.models.engine): real models.

Rows come from pp1q.models.proposal.propose, so each q is built from exactly the
logits the drafter returned and sampled with the STEP's PROPOSAL-domain draw, as the
toy chain does. A drafter request is kept per (session, slot) with its KV cache; a
STEP's committed prefix tells what the verifier committed since the last STEP: when it
is the drafter's committed tokens plus some accepted drafts plus one token, the drafter
commits that (its cache kept); the same prefix again (a RESET, a retried round) resets
the speculative tail; any other prefix (a new generation's context resent, say) closes
and reopens the request from it. Deriving it from the prefix, which the
worker state already checked against the STEP's digest, means a lost or reordered
COMMIT can never leave the drafter on another prefix than the one the verifier holds.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

import torch

from pp1q.core.q import DyadicRow
from pp1q.models.engine import Drafter
from pp1q.models.proposal import HostStaging, propose
from pp1q.wire import Form, Step
from pp1q.wire.validate import step_form
from pp1q.worker.drafting import Proposer
from pp1q.worker.proposer import ProposalSpec

MAX_OPEN_REQUESTS = 256  # drafter requests (KV caches) kept; the oldest is freed beyond


class EngineProposer(Proposer):
    def __init__(self, drafter: Drafter) -> None:
        super().__init__(drafter)
        self.drafter = drafter
        self.staging = HostStaging()  # an accelerator's logits land in one pinned buffer
        # (session, slot) -> (committed tokens, drafts of the last proposal), LRU order
        self._held: collections.OrderedDict[tuple[int, int], tuple[list[int], list[int]]] = (
            collections.OrderedDict())

    def _sync(self, key: tuple[int, int], prefix: list[int]) -> None:
        """Bring the drafter's request to ``prefix`` (commit if it extends it, else reopen)."""
        held = self._held.pop(key, None)
        if held is not None:
            committed, drafts = held
            extra = prefix[len(committed):]
            accepted = len(extra) - 1
            if (prefix[: len(committed)] == committed and 0 <= accepted <= len(drafts)
                    and extra[:accepted] == drafts[:accepted]):
                self.drafter.commit(key, accepted, extra[-1])
            elif prefix != committed:
                self.drafter.close(key)
                held = None
            else:
                self.drafter.reset(key)  # same prefix, a retried or discarded round
        if held is None:
            self.drafter.open(key, prefix)
        self._held[key] = (list(prefix), [])
        while len(self._held) > MAX_OPEN_REQUESTS:
            old, _ = self._held.popitem(last=False)
            self.drafter.close(old)

    def rows(self, step: Step, prefix: list[int]) -> Iterator[tuple[int, DyadicRow | None]]:
        key = (step.session, step.slot)
        self._sync(key, list(prefix))
        drafts = self._held[key][1]
        if step_form(step) is Form.TOKEN_ONLY:
            prev = None
            for i in range(step.depth):
                token = int(torch.argmax(self.drafter.next_logits(key, prev)))  # lowest id on ties
                if i + 1 == step.depth:
                    self.drafter.append(key, token)
                drafts.append(token)
                yield token, None
                prev = token
            return
        spec = ProposalSpec(seed=step.seed, generation=step.generation, round_id=step.round_id,
                            first_position=step.first_position, depth=step.depth,
                            temperature=step.temperature, top_k=step.top_k or None)
        for draft in propose(self.drafter, key, spec, self.staging):
            drafts.append(draft.token)
            yield draft.token, draft.row
