"""A vocabulary shard of SmolLM2-135M (pp1q.models.hf_shard) prefilled a chunk at a time,
as the rank group's PREFILL ops do (pp1q.verifier.ranks.decider): no forward feeds more
than a chunk of prompt ids, the rows after the chunks equal the whole prompt's (and
the full model's) to the cached-vs-uncached bound of tests/models (1e-4, in float64),
and through a rank's ShardedRankState the same round is decided after PREFILL ops as
without them, its forward feeding only the prompt's last chunk and its drafts. Chunks of
CHUNK ids keep the forwards short on 2 shared cores (the shard feeds whatever a PREFILL
asks; the group's PREFILL_CHUNK bound is tests/verifier/ranks/test_ranks_prefill.py's)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hf_shard_cases import DRAWS, limits
from real_model import max_diff

from pp1q.models.engine import PREFILL_CHUNK
from pp1q.runtime.settings import DEFAULT_SHARD_KV_BUDGET as BUDGET

pytestmark = pytest.mark.model

CHUNK = 16  # well under PREFILL_CHUNK: the shard does not care, the CPU does
CACHE_TOLERANCE = 1e-4  # as tests/models/test_hf_shard.py (float64: 4.6e-14 seen there)
LO, HI = 20000, 49152  # the upper shard of the uneven split
TAIL = 5  # the prompt's ids after its last chunk boundary


def _long(story_ids: list[int]) -> list[int]:
    """Two chunks and TAIL ids: the story's ids cycled."""
    n = 2 * CHUNK + TAIL
    return [story_ids[i % len(story_ids)] for i in range(n)]


def _shard(ckpt, lo=LO, hi=HI):
    from pp1q.models.hf_shard import HFShard

    return HFShard.from_checkpoint(ckpt, lo, hi, kv_budget_bytes=BUDGET)


def _fed(shard) -> list[int]:
    """Every later forward's fed ids, logged (the decoder call the shard makes)."""
    fed, hidden = [], shard.lm.hidden

    def spy(ids, *a, **kw):
        fed.append(int(ids.shape[1]))
        return hidden(ids, *a, **kw)
    shard.lm.hidden = spy
    return fed


def test_rows_after_a_chunked_prefill_equal_the_whole_prompts(smol64, story_ids):
    from pp1q.models.hf import CausalLM

    prompt, drafts = _long(story_ids), [11, 262, 314]
    chunked = _shard(smol64)
    fed = _fed(chunked)
    for upto in range(CHUNK, len(prompt), CHUNK):
        chunked.prefill(0, prompt[:upto])
    got = chunked.logits(0, prompt, drafts)
    assert fed == [CHUNK, CHUNK, TAIL + len(drafts)]  # never a whole prompt
    assert CHUNK < PREFILL_CHUNK
    lm = CausalLM(smol64.model)  # the whole prompt's rows: the full model's, uncached
    whole = lm.forward(torch.tensor([prompt + drafts]), lm.new_cache(), last=len(drafts) + 1)
    assert max_diff(got, whole[0][:, LO:HI]) <= CACHE_TOLERANCE
    # a prefill to a boundary the slot already holds feeds nothing; a shorter one crops
    chunked.prefill(0, prompt[:CHUNK])
    assert fed[3:] == [] and chunked._slots[0].tokens == prompt[:CHUNK]


def test_a_rank_decides_the_same_round_after_prefill_ops_feeding_one_chunk(smol, story_ids):
    from pp1q.core.prefix import Prefix
    from pp1q.core.q import build_row
    from pp1q.verifier.ranks.ops import Form, Op, OpKind
    from pp1q.verifier.ranks.sharded import sharded_state
    from pp1q.verifier.ranks.votes import Verdict
    from pp1q_kernels.shard_spmd import deliver

    class Local:  # a group of one rank
        def run(self, req):
            return deliver([req])[0]

    prompt = _long(story_ids)
    head = dict(prefix_len=len(prompt), prefix_digest=Prefix(prompt).digest)
    lim = dataclasses.replace(limits(1, smol.vocab), slots=2)
    g = np.random.default_rng(4)
    drafts = [11, 262, 314]
    rows = []
    for x in drafts:
        logits = g.normal(0, 1.0, smol.vocab)
        logits[x] += 6.0  # the draft has real mass
        rows.append(build_row(logits, top_k=16))
    shard = _shard(smol, 0, smol.vocab)  # one rank: the whole vocabulary
    st = sharded_state(0, lim, shard, 0.0)
    st.decisions.comm, st.decisions.draws = Local(), DRAWS
    for slot in (0, 1):  # slot 0 prefilled by PREFILL ops, slot 1 not
        st.apply(Op(OpKind.OPEN, slot, seed=3, prompt=np.asarray(prompt, np.int32), **head),
                 Verdict(True))
    for upto in range(CHUNK, len(prompt), CHUNK):
        op = Op(OpKind.PREFILL, 0, upto=upto, **head)
        (v,) = st.votes([op])
        assert v.tolist()[0] == 1  # yes
        st.apply(op, Verdict(True))
    fed = _fed(shard)
    decided = []
    for slot in (0, 1):  # the same round (seed, ids, rows), one exchange each
        (v,) = st.votes([Op(OpKind.ROUND, slot, 1, 1, seed=3, drafts=np.asarray(drafts, np.int32),
                            rows=tuple((Form.SPARSE, *r.to_sparse()) for r in rows), **head)])
        decided.append(v.tolist())
    assert decided[0] == decided[1] and decided[0][0] == 1
    assert fed == [TAIL + len(drafts), len(prompt) + len(drafts)]


class _EvictsMidPrefill:
    """Planted: the budget fitted as before the exemption, any slot least recently used
    first (a slot between two PREFILL ops included)."""

    def _fit_budget(self) -> None:
        while self._slots and self.kv_bytes > self.budget:
            self._slots.popitem(last=False)
            self.evictions += 1


def _two_prompts_interleaved(shard, story_ids) -> tuple[list[int], int]:
    """Two prompts prefilled a chunk at a time, their PREFILL ops alternating (two
    requests opened together), under a budget that holds one whole prompt's K/V but not
    both; then each slot's first round. (The forwards' fed ids, the evictions by then.)"""
    prompts = [_long(story_ids), _long(story_ids[7:])]
    shard.prefill(9, prompts[0])  # one whole prompt's K/V, buffers' room included
    shard.budget = shard.kv_bytes + 1
    shard.close(9)
    fed = _fed(shard)
    for upto in range(CHUNK, len(prompts[0]), CHUNK):
        for slot, prompt in enumerate(prompts):
            shard.prefill(slot, prompt[:upto])
    evicted_mid_prefill = shard.evictions
    for slot, prompt in enumerate(prompts):
        shard.logits(slot, prompt, [11])
    return fed, evicted_mid_prefill


@pytest.mark.parametrize("planted", [False, True], ids=["shard", "planted-evicts-mid-prefill"])
def test_two_prompts_under_a_small_budget_do_not_evict_each_other_mid_prefill(
        smol, story_ids, planted):
    """A slot between PREFILL ops is not evicted: each op feeds its chunk, never the whole
    prefix again. Before, two long prompts whose K/V the budget could not hold together
    evicted each other at every op, each op recomputing its slot's prefix (quadratic
    work inside the group's exchanges). Once a slot's first row is computed it is
    evictable again and the budget holds."""
    from pp1q.models.hf_shard import HFShard

    cls = type("Planted", (_EvictsMidPrefill, HFShard), {}) if planted else HFShard
    shard = cls.from_checkpoint(smol, LO, HI, kv_budget_bytes=BUDGET)
    fed, evicted_mid_prefill = _two_prompts_interleaved(shard, story_ids)
    chunks = [CHUNK] * 4  # two chunks of each prompt, alternating
    rounds = [TAIL + 1] * 2  # each first round feeds its last chunk and its draft
    if planted:  # the planted shard recomputes: the check below must see it
        assert fed != chunks + rounds and evicted_mid_prefill > 0
        return
    assert fed == chunks + rounds and evicted_mid_prefill == 0
    assert shard.evictions >= 1 and shard.kv_bytes <= shard.budget  # the budget holds again
