"""The per-request table both Hugging Face roles keep: request -> (Ledger, its KV cache).

The drafter (hf_drafter.py) and the target (hf_target.py) open, commit, reset and close
a request alike: ``open`` prefills every committed token but the last (the drafter's
first row then feeds one uncached token, or two after a bonus; the target's round always
one; a long prompt never pads a target's batch), ``extend`` prefills a prompt's next
chunk the same way (the verifier's chunked prefill), and each rollback crops the cache to
what the ``Ledger`` keeps. What a role does with the cache in between, one row at a time
or a stacked batch, is its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pp1q.models.engine import RequestKey, lookup
from pp1q.models.hf_cache import cache_bytes, crop
from pp1q.models.ledger import Ledger


class LedgerCaches:
    """The engine seam's open / commit / reset / close for an ``HFRole`` (which holds the
    model's forward ``lm`` and the table ``_requests``)."""

    lm: object
    _requests: dict

    def _get(self, request: RequestKey) -> tuple[Ledger, object]:
        return lookup(self._requests, request)

    def open(self, request: RequestKey, committed: Sequence[int]) -> None:
        ledger = Ledger.start(committed)
        cache = self.lm.new_cache()
        self._prefill(ledger, cache)
        self._requests[request] = (ledger, cache)

    def extend(self, request: RequestKey, committed: Sequence[int]) -> None:
        ledger, cache = self._get(request)
        ledger.extend(committed)
        try:
            self._prefill(ledger, cache)
        except BaseException:  # its layers may differ in length now: start this cache over
            ledger.cached = 0
            self._requests[request] = (ledger, self.lm.new_cache())
            raise

    def _prefill(self, ledger: Ledger, cache) -> None:
        """Cache every committed token but the last (the first row or round feeds one)."""
        feed = ledger.committed[ledger.cached:-1]
        if feed:
            self.lm.forward(torch.tensor([feed]), cache, last=1)
            ledger.cached = len(ledger.committed) - 1

    def kv_bytes(self, request: RequestKey) -> int:
        entry = self._requests.get(request)
        return 0 if entry is None else cache_bytes(entry[1])

    def commit(self, request: RequestKey, accepted: int, token: int) -> None:
        ledger, cache = self._get(request)
        crop(cache, ledger.commit(accepted, token))

    def reset(self, request: RequestKey) -> None:
        ledger, cache = self._get(request)
        crop(cache, ledger.reset())

    def close(self, request: RequestKey) -> None:
        self._requests.pop(request, None)
