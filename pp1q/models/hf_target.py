"""The target over a Hugging Face causal LM: one batched forward per round.

Each request keeps the K/V of its committed tokens (a DynamicCache, [1, heads, L, dim]
per layer). A round stacks the requests into one batch: caches left-padded to the longest, new
tokens right-padded, an attention mask hiding both paddings, and explicit position
ids (each request's own positions, so padding never shifts RoPE). After the forward
each request takes back its slice of the grown cache.

Why left-padded stacking and not a loop of per-request forwards: measured on the
2-core CPU with SmolLM2-135M, 2 requests x 4-6 tokens cost 97 ms stacked vs 184 ms
looped, 4 requests 110 ms vs 329 ms; a forward's cost barely grows with its token
count at these sizes. The price is a copy of every cache into the stacked tensors
each round (cheap next to the forward at these lengths) and float differences of a
few 1e-5 in the logits against an unpadded forward (the masked kernels sum in a
different order); tests/models checks both stay under 1e-4. A batch of one request
runs unpadded and unmasked, on the request's own cache.

Each request keeps a live DynamicCache: a rollback is a crop (views, no copy), and a
round of one request forwards on it directly. Rebuilding a cache from per-layer
tensors every round copied the whole cache once more (DynamicCache.update
concatenates), about 1 ms a round at 100 tokens on one core and growing with the
prefix. Its layers append in place (pp1q.models.hf_cache: a round on a 4,096-id cache
no longer copies the whole cache, 9-17% of a round's CPU with one thread). A forward
that fails part-way may leave its layers at different lengths, so
its request's cache is dropped (the next round re-feeds the committed tokens).

Requests are opened with an eager prefill of prompt[:-1], so a round feeds only one
committed token (the last, whose forward gives row 0) plus the drafts, and a long
prompt never pads a whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.models.engine import RequestKey, Target
from pp1q.models.hf import HFRole, forward_stacked
from pp1q.models.hf_cache import crop, kv_tensors
from pp1q.models.hf_requests import LedgerCaches
from pp1q.models.ledger import Ledger


@dataclass
class _Plan:
    """One request's part of a round: what to feed, on top of which cached prefix."""

    request: RequestKey
    ledger: Ledger
    cache: object  # the request's DynamicCache, cropped to ``start`` tokens
    start: int
    feed: list[int]  # tokens[start:]: uncached committed tokens, then the drafts
    rows: int  # len(drafts) + 1: the last ``rows`` fed positions give the logits


class HFTarget(LedgerCaches, HFRole, Target):
    """Batched target scoring over a causal LM. ``_requests``: request -> (Ledger, the
    DynamicCache of its committed tokens); open, commit, reset and close are
    LedgerCaches' (hf_requests.py), shared with the drafter."""

    def score(self, batch: Sequence[tuple[RequestKey, Sequence[int]]]) -> list[torch.Tensor]:
        if len({req for req, _ in batch}) != len(batch):
            raise LocalProtocolError(Reason.STATE_NOT_ALLOWED, "a request twice in one batch")
        found = [(req, *self._get(req), drafts) for req, drafts in batch]  # all known first
        plans = []
        for req, ledger, cache, drafts in found:
            ledger.spec = [int(t) for t in drafts]  # replaces drafts scored but not committed
            rows = len(ledger.spec) + 1
            start = ledger.feed_start(rows)
            crop(cache, start)
            ledger.cached = start  # what the cache holds now, whatever happens next
            plans.append(_Plan(req, ledger, cache, start, ledger.tokens[start:], rows))
        if not plans:
            return []
        if len(plans) > 1:
            return self._forward_stacked(plans)
        return [self._forward_one(plans[0])]

    def _forward_one(self, plan: _Plan) -> torch.Tensor:
        try:
            logits = self.lm.forward(torch.tensor([plan.feed]), plan.cache, last=plan.rows)
        except BaseException:  # layers may differ in length now: start this cache over
            plan.ledger.cached = 0
            self._requests[plan.request] = (plan.ledger, self.lm.new_cache())
            raise
        plan.ledger.cached = len(plan.ledger.tokens)
        return logits[0]

    def _forward_stacked(self, plans: list[_Plan]) -> list[torch.Tensor]:
        def run(ids, cache, mask, pos):
            return self.lm.forward(ids, cache, attention_mask=mask, position_ids=pos)

        grown = forward_stacked(self.lm, run, [(kv_tensors(p.cache), p.start, p.feed, p.rows)
                                               for p in plans])
        out = []
        for p, (logits, kv) in zip(plans, grown, strict=True):
            own = self.lm.new_cache()  # its slice, out of the stacked tensors
            for i, (k, v) in enumerate(kv):
                own.update(k, v, i)
            p.ledger.cached = len(p.ledger.tokens)
            self._requests[p.request] = (p.ledger, own)
            out.append(logits)
        return out
