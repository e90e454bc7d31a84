"""The toy pair behind the engine seam: thin wrappers, the toy models themselves unchanged.

``ToyDrafterEngine`` produces, row for row, the logits the worker's toy chain uses
(backbone row i of the committed prefix plus the Markov bias of x_{i-1}), so a chain
through the seam samples the same tokens with the same q as pp1q.worker.proposer.
``ToyTargetEngine`` returns ``ToyTarget.logits(committed, drafts)``; the toy has no
cache, so rollback is bookkeeping only. Both use the identity id map of the toy.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pp1q.models.engine import Drafter, RequestKey, Target, lookup
from pp1q.models.ledger import Ledger
from pp1q.models.toy import ToyDrafter, ToyTarget, vocab_map_id


class _Requests:
    def __init__(self) -> None:
        self.ledgers: dict[RequestKey, Ledger] = {}

    def get(self, request: RequestKey) -> Ledger:
        return lookup(self.ledgers, request)


class ToyDrafterEngine(Drafter):
    def __init__(self, model: ToyDrafter) -> None:
        self.model = model
        self.vocab = model.vocab
        self.identity = model.identity
        self.target_identity = model.target_identity
        self.variant = model.variant
        self.tokenizer_digest = vocab_map_id(model.vocab)
        self._requests = _Requests()
        self._backbone: dict[RequestKey, np.ndarray] = {}  # this round's rows, grown on demand

    def open(self, request: RequestKey, committed: Sequence[int]) -> None:
        self._requests.ledgers[request] = Ledger.start(committed)
        self._backbone.pop(request, None)

    def extend(self, request: RequestKey, committed: Sequence[int]) -> None:
        self._requests.get(request).extend(committed)
        self._backbone.pop(request, None)  # its rows read the committed prefix

    def append(self, request: RequestKey, token: int) -> None:
        self._requests.get(request).spec.append(int(token))

    def next_logits(self, request: RequestKey, token: int | None = None) -> torch.Tensor:
        ledger = self._requests.get(request)
        if token is not None:
            ledger.spec.append(int(token))
        i = len(ledger.spec)  # 0-based draft position of the row asked for
        rows = self._backbone.get(request)
        if rows is None or rows.shape[0] <= i:
            # backbone row i does not depend on how many rows are asked for (ToyDrafter.
            # backbone sums each row in one fixed order)
            rows = self.model.backbone(ledger.committed, max(8, 2 * (i + 1)))
            self._backbone[request] = rows
        prev = ledger.spec[-1] if ledger.spec else ledger.committed[-1]
        return torch.from_numpy(self.model.row_logits(rows[i], prev))

    def commit(self, request: RequestKey, accepted: int, token: int) -> None:
        self._requests.get(request).commit(accepted, token)
        self._backbone.pop(request, None)

    def reset(self, request: RequestKey) -> None:
        self._requests.get(request).reset()

    def close(self, request: RequestKey) -> None:
        self._requests.ledgers.pop(request, None)
        self._backbone.pop(request, None)


class ToyTargetEngine(Target):
    def __init__(self, model: ToyTarget) -> None:
        self.model = model
        self.vocab = model.vocab
        self.identity = model.identity
        self.tokenizer_digest = vocab_map_id(model.vocab)
        self._requests = _Requests()

    def open(self, request: RequestKey, prompt: Sequence[int]) -> None:
        self._requests.ledgers[request] = Ledger.start(prompt)

    def extend(self, request: RequestKey, prompt: Sequence[int]) -> None:
        self._requests.get(request).extend(prompt)

    def score(self, batch: Sequence[tuple[RequestKey, Sequence[int]]]) -> list[torch.Tensor]:
        out = []
        for request, drafts in batch:
            ledger = self._requests.get(request)
            ledger.spec = [int(t) for t in drafts]
            out.append(torch.from_numpy(self.model.logits(ledger.committed, ledger.spec)))
        return out

    def commit(self, request: RequestKey, accepted: int, token: int) -> None:
        self._requests.get(request).commit(accepted, token)

    def reset(self, request: RequestKey) -> None:
        self._requests.get(request).reset()

    def close(self, request: RequestKey) -> None:
        self._requests.ledgers.pop(request, None)
