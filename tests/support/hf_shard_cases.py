"""A real-model scenario for the vocabulary-sharded ranks (tests/models/test_hf_shard.py):
the same ops decided by N gloo ranks, each holding its rows of SmolLM2-135M's LM head
(hf_shard_gloo_rank.py), and by one rank holding their concatenation (the test itself).

``play(decisions, tokenizer, rank)`` runs the scenario through ShardedDecisions.decide, the
production decision path (temperature, dense q scattered by slices, sparse q whole,
greedy, target-only), extending the prefix by each decision; it returns the decisions.
q rows come from a seeded generator with each draft given real mass, so every rank
builds the same rows; the drafts are the story's next words from CONTINUATION.
"""

from __future__ import annotations

import numpy as np
import torch

from pp1q.core.drawkey import DrawKeys
from pp1q.core.prefix import Prefix
from pp1q.core.q import build_row
from pp1q.models.processors import Processors
from pp1q.verifier.ranks.ops import Form, Limits, Op, OpKind
from pp1q.verifier.ranks.replica import SlotReplica, committed_tokens

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
CUTS = (20000,)  # two uneven shards: [0, 20000) and [20000, 49152)
DEPTH = 3
DRAWS = DrawKeys(bytes(range(32)))
# (kind, temperature, q form): sampled rounds at T = 1 and T = 0.7 with sparse and
# dense q, a greedy round, target-only steps sampled and greedy
STEPS = (("round", 1.0, "sparse"), ("round", 1.0, "dense"), ("round", 0.7, "sparse"),
         ("round", 0.7, "dense"), ("target_only", 1.0, None), ("target_only", 0.7, None),
         ("greedy_round", 1.0, None), ("greedy_target_only", 1.0, None))
# drafts: the story's plausible next words (accepted or not by the target), and in every
# other step a last draft from the far side of the cut (its ratio test on rank 1)
CONTINUATION = (" had a small boat and a big dog. Every morning he went out to sea to catch"
                " fish for the market of the village, and every evening he came home to his")
FAR = (30000, 45000)


def limits(world: int, vocab: int) -> Limits:
    return Limits(world=world, slots=1, depth=DEPTH, vocab=vocab, dense_len=vocab,
                  max_support=32, sharded=True)


def bounds(world: int, vocab: int) -> tuple[tuple[int, int], ...]:
    edges = [0, *CUTS[: world - 1], vocab]
    return tuple(zip(edges[:-1], edges[1:], strict=True))


def _rows(g, vocab: int, drafts: list[int], dense: bool):
    out = []
    for x in drafts:
        logits = g.normal(0, 1.0, vocab)
        logits[x] += 6.0  # the draft has real mass, as a sampling drafter's would
        out.append(build_row(logits, top_k=None if dense else 16))
    return out


def play(decisions, tokenizer, rank: int) -> list[list[int]]:
    vocab = decisions.vocab
    prompt = tokenizer(PROMPT)["input_ids"]
    start = len(prompt)
    cont = tokenizer(CONTINUATION, add_special_tokens=False)["input_ids"]
    g = np.random.default_rng(2026)
    out = []
    for k, (kind, temperature, form) in enumerate(STEPS):
        greedy = kind.startswith("greedy")
        s = SlotReplica(seed=77 + k, greedy=greedy, prefix=Prefix(prompt),
                        processors=Processors(temperature))
        prompt_len = len(prompt)
        at = len(prompt) - start  # tokens committed so far: the story's next words
        drafts = [cont[(at + i) % len(cont)] for i in range(DEPTH)]
        if k % 2:
            drafts[-1] = FAR[k // 2 % len(FAR)]
        rows = _rows(g, vocab, drafts, form == "dense")
        if kind.endswith("target_only"):
            op = Op(OpKind.TARGET_ONLY, 0, 1 + k, k, prefix_len=prompt_len)
        else:
            wire = () if greedy else tuple(
                (Form.SHARDED, None, None) if form == "dense" else (Form.SPARSE, *r.to_sparse())
                for r in rows)
            op = Op(OpKind.ROUND, 0, 1 + k, k, greedy=greedy, prefix_len=prompt_len,
                    drafts=np.asarray(drafts, np.int32), rows=wire,
                    q_rows=tuple(rows) if rank == 0 and not greedy else None)
        res = decisions.decide(op, s)
        out.append([res.accepted, res.token])
        prompt = prompt + committed_tokens(op, res.accepted, res.token)  # the next step's
    return out


class Concat:
    """One rank holding several shards' logits side by side: the reference."""

    def __init__(self, shards) -> None:
        self.shards = shards
        self.lo, self.hi, self.vocab = shards[0].lo, shards[-1].hi, shards[0].vocab

    def logits(self, slot, prefix, drafts) -> torch.Tensor:
        return torch.cat([s.logits(slot, prefix, drafts) for s in self.shards], dim=-1)

    def close(self, slot) -> None:
        for s in self.shards:
            s.close(slot)
