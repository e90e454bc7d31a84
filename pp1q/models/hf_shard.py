"""A Hugging Face target's LM head split by vocabulary rows: one rank's logits, never a
full row (``pp1q verifier --ranks N --shard-vocab --model PATH``).

A vocabulary-parallel LM head keeps its input replicated, so every rank runs the whole
decoder (``model.get_decoder()``: embeddings, layers, final norm) and multiplies its
last hidden states by its own rows [lo, hi) of the head: logits [D + 1, hi - lo].
The rows are a copy of that slice (tied embeddings: the input embedding stays whole, the
head is the separate slice); the shard keeps the decoder, never the causal-LM wrapper,
so an untied full head is freed once the loader lets the checkpoint go
(pp1q.models.serving.load_target).

Exactness of the head: ``HFShard`` refuses (unsupported_feature) a model whose logits are
not exactly its head's product of the decoder's output (a soft cap or a scale after the
head, which the shard would silently skip): at construction it runs the full model once
on PROBE_TOKENS ids and requires bit equality with the decoder times the whole head.
Sliding-window attention is refused at construction too (its caches crop differently:
pp1q.models.hf.CausalLM), so a model the shard cannot serve never joins a group.
The slice's product then differs from the full row's ids only by the matmul's blocking,
which depends on the row count and the CPU (SmolLM2-135M, float32: bit-identical on the
balanced 2- and 3-way splits on both reference CPUs, up to 3.8e-6 or 2.7e-5 apart on
others); tests/models/test_hf_shard.py holds it to the float32 dot-product error bound
(docs/operations.md). The rank group's decisions are bit-identical to one rank deciding from the
concatenation of the shards' logits whatever the split (the exact integer sampler).

KV cache per slot, with no event mirroring: each slot keeps the tokens it holds K/V for;
a request (committed prefix + drafts) reuses the longest common prefix with them and the
rest is cropped, so a commit, a discarded round, a reset or a reordered close all leave
a cache that is either reused exactly (K/V at a position depend only on the tokens up to
it) or cut. A slot's cache is freed when its request ends (``close``); all slots together
stay under ``kv_budget_bytes``: past it the least recently used caches are dropped
(``evictions`` counts them; their next round recomputes the prefix, same logits to the
cached-vs-uncached tolerance of tests/models, 1e-4). ``prepare`` runs the requests of
one exchange in one stacked forward (pp1q.models.hf.forward_stacked, HFTarget's batch).
``prefill`` grows a slot's K/V by one chunk of its prompt (the group's PREFILL ops,
pp1q.verifier.ranks.decider), so a long prompt does not run whole inside one exchange;
unless the budget evicted the slot's K/V between two of them: the next recomputes the
lost prefix in its one forward, as a round after an eviction does (two long prompts
under a budget that cannot hold both evict each other at every op).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.models.hf import CausalLM, Checkpoint, cache_from, forward_stacked, logits_width
from pp1q.models.hf_cache import cache_bytes, crop, kv_tensors

PROBE_TOKENS = 8  # ids run through the whole model once to prove logits = head(decoder)


@dataclass
class _SlotCache:
    tokens: list[int]  # K/V held for exactly these tokens
    cache: object  # a transformers DynamicCache
    nbytes: int = 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class HFShard:
    """Rows [lo, hi) of a causal LM's head over its whole decoder, with per-slot K/V."""

    def __init__(self, model, lo: int, hi: int, *, identity: str,
                 kv_budget_bytes: int) -> None:
        """``kv_budget_bytes``: the verifier's ``shard_kv_budget_bytes`` (its default and
        bounds are in pp1q.runtime.settings)."""
        vocab = logits_width(model)
        if not 0 <= lo < hi <= vocab:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE,
                                     f"shard [{lo}, {hi}) of a {vocab}-id head")
        head = model.get_output_embeddings()
        if head is None or getattr(head, "weight", None) is None \
                or tuple(head.weight.shape[:1]) != (vocab,):
            raise LocalProtocolError(Reason.UNSUPPORTED_FEATURE,
                                     "the model has no linear LM head to split by rows")
        self.lo, self.hi, self.vocab, self.identity = lo, hi, vocab, identity
        self.dtype = str(head.weight.dtype).removeprefix("torch.")  # ranks must agree
        decoder = model.get_decoder()
        _check_head_is_last(model, decoder, head)
        with torch.no_grad():
            self.weight = head.weight[lo:hi].detach().clone()  # never a view of the whole
            bias = getattr(head, "bias", None)
            self.bias = None if bias is None else bias[lo:hi].detach().clone()
        self.device = self.weight.device  # where its rows are (a rank's exchange thread)
        self.lm = CausalLM(decoder)
        self.lm.new_cache()  # sliding-window layers are refused here, at load, not per op
        self.budget = int(kv_budget_bytes)
        self._slots: OrderedDict[Hashable, _SlotCache] = OrderedDict()  # LRU order
        self._ready: dict[Hashable, tuple[tuple[int, ...], torch.Tensor]] = {}  # prepare()
        # slots a PREFILL op built K/V for whose first row has not come yet: never evicted,
        # or two prompts under a budget that cannot hold both evict each other at every op
        # and each op recomputes its whole prefix (quadratic). What this lets past the
        # budget is bounded by the group's slots x a prompt's K/V as the buffers hold it
        # (up to GROWTH = 1.5x the tokens', pp1q.models.hf_cache) (the worker's drafter
        # budget exempts a request mid-prefill the same way).
        self._prefilling: set[Hashable] = set()
        self.evictions = 0  # slot caches dropped to stay under the budget (a metric)
        self.cached_tokens = 0  # tokens whose K/V a request reused (benchmarks)
        self.fed_tokens = 0  # tokens run through the decoder (benchmarks)

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint, lo: int, hi: int, **kw) -> HFShard:
        return cls(ckpt.model, lo, hi, identity=ckpt.identity, **kw)

    @property
    def width(self) -> int:
        return self.hi - self.lo

    def logits(self, slot: Hashable, prefix: Sequence[int], drafts: Sequence[int]
               ) -> torch.Tensor:
        """Logits [len(drafts) + 1, hi - lo] of this shard's ids after ``prefix`` and
        each prefix of ``drafts`` (row i sees drafts[:i]), on the CPU; float32 (float64
        for a float64 model)."""
        seq, rows = _request(prefix, drafts)
        self._prefilling.discard(slot)  # its first row: the prompt's last chunk is fed
        ready = self._ready.pop(slot, None)
        if ready is not None and ready[0] == tuple(seq) and ready[1].shape[0] == rows:
            return ready[1]
        entry, keep = self._reuse(slot, seq, rows)
        h = self.lm.hidden(torch.tensor([seq[keep:]]), entry.cache, rows)[0]
        self._keep(slot, entry, seq, keep)
        return self._head(h)

    def prefill(self, slot: Hashable, tokens: Sequence[int]) -> None:
        """Bring ``slot``'s K/V to exactly ``tokens`` (a prompt up to its next chunk
        boundary: the rank group's PREFILL op) in one forward of what it does not hold
        yet; the slot's next ``logits`` or ``prepare`` reuses them like any cached
        prefix. No row is computed: a prefill needs no logits."""
        seq = [int(t) for t in tokens]
        self._ready.pop(slot, None)
        self._prefilling.add(slot)
        entry, keep = self._reuse(slot, seq, 0)
        if keep < len(seq):
            self.lm.hidden(torch.tensor([seq[keep:]]), entry.cache, 1)
        self._keep(slot, entry, seq, keep)

    def prepare(self, requests: Sequence[tuple[Hashable, Sequence[int], Sequence[int]]]
                ) -> None:
        """Run several slots' next ``logits`` calls, (slot, prefix, drafts) each, in one
        stacked forward (pp1q.models.hf.forward_stacked: 2 requests cost about half of
        two forwards on the 2-core CPU); each ``logits`` call that asks for exactly a
        prepared request then returns its rows. Every rank prepares the same batch in the
        same order, so every rank's rows come from the same computation."""
        self._ready = {}
        requests = [r for r in requests if r[1]]  # no prefix: its ``logits`` call refuses it
        if len(requests) < 2 or len({slot for slot, _, _ in requests}) != len(requests):
            return  # one request (or a slot twice: never in one exchange) runs alone
        plans = []
        for slot, prefix, drafts in requests:
            seq, rows = _request(prefix, drafts)
            self._prefilling.discard(slot)
            entry, keep = self._reuse(slot, seq, rows)
            plans.append((slot, entry, seq, keep, rows))

        def run(ids, cache, mask, pos):
            return self.lm.hidden(ids, cache, attention_mask=mask, position_ids=pos)

        out = forward_stacked(self.lm, run, [(kv_tensors(e.cache), keep, seq[keep:], rows)
                                             for _, e, seq, keep, rows in plans])
        for (slot, entry, seq, keep, _), (h, kv) in zip(plans, out, strict=True):
            entry.cache = cache_from(self.lm, kv)
            self._keep(slot, entry, seq, keep)
            self._ready[slot] = (tuple(seq), self._head(h))

    def _reuse(self, slot: Hashable, seq: list[int], rows: int) -> tuple[_SlotCache, int]:
        """The slot's cache cut to what it holds of ``seq``, but never past the rows whose
        logits are wanted (they are fed again); and how many tokens that keeps."""
        entry = self._slots.pop(slot, None)
        if entry is None:
            entry = _SlotCache([], self.lm.new_cache())
        keep = min(common_prefix(entry.tokens, seq), len(seq) - rows)
        crop(entry.cache, keep)
        return entry, keep

    def _keep(self, slot: Hashable, entry: _SlotCache, seq: list[int], keep: int) -> None:
        self.cached_tokens += keep
        self.fed_tokens += len(seq) - keep
        entry.tokens = seq
        entry.nbytes = cache_bytes(entry.cache)
        self._slots[slot] = entry  # most recently used
        self._fit_budget()

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            out = torch.nn.functional.linear(h, self.weight, self.bias)
        out = out if out.dtype == torch.float64 else out.float()
        return out.cpu()

    def close(self, slot: Hashable) -> None:
        """Free ``slot``'s cache (its request ended; unknown slots are ignored)."""
        self._slots.pop(slot, None)
        self._ready.pop(slot, None)
        self._prefilling.discard(slot)

    @property
    def kv_bytes(self) -> int:
        return sum(e.nbytes for e in self._slots.values())

    def _fit_budget(self) -> None:
        over = self.kv_bytes - self.budget
        for slot in [s for s in self._slots if s not in self._prefilling]:  # LRU first
            if over <= 0:
                return
            over -= self._slots.pop(slot).nbytes  # least recently used first, this one last
            self.evictions += 1


def _request(prefix: Sequence[int], drafts: Sequence[int]) -> tuple[list[int], int]:
    seq = [int(t) for t in prefix] + [int(t) for t in drafts]
    if not prefix:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "a row needs a committed token")
    return seq, len(drafts) + 1


def _check_head_is_last(model, decoder, head) -> None:
    """Refuse a model whose logits are not exactly head(decoder output) (UNSUPPORTED_FEATURE):
    a shard computes only that product, so anything applied after it would be skipped."""
    ids = torch.arange(1, PROBE_TOKENS + 1).unsqueeze(0).to(model.device)
    with torch.inference_mode():
        full = model(input_ids=ids, use_cache=False).logits
        h = decoder(input_ids=ids, use_cache=False).last_hidden_state
        mine = torch.nn.functional.linear(h, head.weight, getattr(head, "bias", None))
    if full.shape != mine.shape or not torch.equal(full, mine):
        raise LocalProtocolError(
            Reason.UNSUPPORTED_FEATURE,
            f"{type(model).__name__} changes its logits after the LM head (a soft cap or a "
            "scale?): its head cannot be split by vocabulary rows")
