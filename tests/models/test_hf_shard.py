"""A Hugging Face model's LM head split by vocabulary rows (pp1q.models.hf_shard), on
the embedded SmolLM2-135M: a shard's logits against the same ids of the full model's
row, the per-slot K/V cache against uncached forwards after accepts, rejections,
resets and evictions, the head kept as its own slice, a model that transforms its
logits after the head refused, and a 2-rank gloo group with uneven shards deciding
exactly as one rank holding the concatenation of their logits, with no collective
carrying a vocabulary-wide row."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from hf_shard_cases import DEPTH, Concat, bounds, limits, play
from hf_shard_cases import DRAWS as SCENARIO_DRAWS
from rank_harness import free_port
from real_model import max_diff

from pp1q.runtime.launcher import run_together
from pp1q.runtime.settings import DEFAULT_SHARD_KV_BUDGET as BUDGET

pytestmark = pytest.mark.model

# cached against uncached forwards, the bound (tests/models/test_hf_target.py),
# in float64 (smol64): in float32 the two differ by up to 1.1e-4 over 30 layers
# (tests/models/conftest.py; 6.9e-5 seen on these shard rows), at the bound itself; in
# float64 by 4.6e-14 at most here, so the noise is far below the bound and a cache or
# position error (whole logits off) far above it
CACHE_TOLERANCE = 1e-4
RUN_S = 300  # bound on the gloo group's run (two ranks load the model on 2 shared cores)
SUPPORT = Path(__file__).resolve().parents[1] / "support"
SPLITS = ((0, 24576), (24576, 49152), (0, 20000), (20000, 49152), (100, 49151))


def _shard(smol, lo, hi, **kw):
    from pp1q.models.hf_shard import HFShard

    return HFShard.from_checkpoint(smol, lo, hi, **{"kv_budget_bytes": BUDGET, **kw})


def _full_rows(smol, seq, rows):
    """The full model's last ``rows`` logits of ``seq``, uncached: the reference row."""
    from pp1q.models.hf import CausalLM

    lm = CausalLM(smol.model)
    return lm.forward(torch.tensor([list(seq)]), lm.new_cache(), last=rows)[0]


def _head_bound(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """How far two float32 products h @ weight.T may differ entry by entry when the
    matmul sums each length-K dot product in another order (its blocking depends on the
    row count and the CPU: bit-identical on one machine, 2.7e-5 apart on another): each
    is within gamma_K * sum_i |h_i w_i| of the exact value, gamma_K = K u / (1 - K u),
    u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, 3.1), so the two
    are within twice that. Machine-independent; the shards here differ from the full rows
    by 0.5% of it at most. A wrong row and a head rounded to bfloat16 or float16 are
    outside it; a head scaled by 1 + 1e-4 is not (a bound of 4 sqrt(K) u sum|h w|, 24x
    tighter, would catch that too, but holds only for rounding errors that behave as
    random, which no ordering promises)."""
    k = h.shape[-1]
    gamma = k * 2.0 ** -24 / (1 - k * 2.0 ** -24)
    return 2 * gamma * (h.double().abs() @ weight.double().abs().T)


def _within_head_bound(got, want, bound) -> bool:
    return bool(((got.double() - want.double()).abs() <= bound).all())


def test_shard_logits_are_the_full_rows_ids(smol, story_ids):
    prefix, drafts = story_ids[:12], [11, 262, 30000]
    rows = len(drafts) + 1
    full = _full_rows(smol, prefix + drafts, rows)
    with torch.inference_mode():  # the full rows' hidden states, for the bound
        h = smol.model.get_decoder()(
            input_ids=torch.tensor([prefix + drafts])).last_hidden_state[0, -rows:]
    bound = _head_bound(h, smol.model.get_input_embeddings().weight)  # tied: the head
    for lo, hi in SPLITS:
        got = _shard(smol, lo, hi).logits(0, prefix, drafts)
        assert got.shape == (rows, hi - lo)
        assert _within_head_bound(got, full[:, lo:hi], bound[:, lo:hi]), (lo, hi)
    # the bound tells rows apart: a shard one row off ([lo + 1, hi + 1) read as [lo, hi))
    # is outside it
    off = _shard(smol, 20001, 49152).logits(0, prefix, drafts)
    assert not _within_head_bound(off, full[:, 20000:49151], bound[:, 20000:49151])
    # and a head kept at a lower precision by mistake: the shard's rows rounded to
    # bfloat16 or float16 (logits 0.08 and 0.016 off at most) are outside it too
    for dtype in (torch.bfloat16, torch.float16):
        low = _shard(smol, 0, 20000)
        with torch.no_grad():
            low.weight.copy_(low.weight.to(dtype).float())
        got = low.logits(0, prefix, drafts)
        assert not _within_head_bound(got, full[:, :20000], bound[:, :20000]), dtype


def test_the_head_is_its_own_slice_and_the_embedding_stays_whole(smol):
    shard = _shard(smol, 20000, 49152)
    embed = smol.model.get_input_embeddings().weight
    assert shard.weight.shape == (29152, embed.shape[1])
    assert shard.weight.untyped_storage().data_ptr() != embed.untyped_storage().data_ptr()
    assert shard.lm.model.get_input_embeddings().weight.shape[0] == 49152  # input: whole
    assert torch.equal(shard.weight, embed[20000:])  # tied: the same rows, copied


def test_cached_rounds_equal_uncached_after_accept_reject_reset_and_close(smol64, story_ids):
    shard = _shard(smol64, 0, 20000)
    prompt = story_ids[:10]
    steps = [  # (prefix, drafts): what a slot sees round after round
        (prompt, [11, 262, 314]),
        (prompt + [11, 99], [5, 6, 7]),  # one accepted, a correction
        (prompt + [11, 99], [8, 9, 10]),  # a discarded round (reset): same prefix again
        (prompt + [11, 99, 8, 9, 10, 42], []),  # all accepted + bonus, then target-only
        (prompt[:6], [1, 2]),  # a new request on the slot, sharing part of the prompt
    ]
    for prefix, drafts in steps:
        got = shard.logits(0, prefix, drafts)
        want = _full_rows(smol64, prefix + drafts, len(drafts) + 1)[:, :20000]
        assert max_diff(got, want) <= CACHE_TOLERANCE, (prefix, drafts)
    assert shard.cached_tokens > 3 * len(prompt)  # the cache was reused, not recomputed
    shard.close(0)
    assert shard.kv_bytes == 0


def test_a_cache_past_its_budget_is_evicted_counted_and_recomputed(smol64, story_ids):
    shard = _shard(smol64, 0, 20000, kv_budget_bytes=1)  # every cache is over budget
    prefix = story_ids[:8]
    for _ in range(2):
        got = shard.logits(0, prefix, [11])
        assert max_diff(got, _full_rows(smol64, prefix + [11], 2)[:, :20000]) <= CACHE_TOLERANCE
    assert shard.evictions == 2 and shard.kv_bytes == 0 and shard.cached_tokens == 0


def test_the_verifiers_setting_is_each_ranks_budget(smol, tmp_path):
    from pp1q.models.hf import export_folder
    from pp1q.models.serving import load_target
    from pp1q.runtime.settings import MIN_SHARD_KV_BUDGET, VerifierSettings

    folder = export_folder(smol, tmp_path)
    settings = VerifierSettings(model=str(folder), ranks=2, shard_vocab=True,
                                shard_kv_budget_bytes=MIN_SHARD_KV_BUDGET)
    shard = load_target(settings, shard=lambda vocab: (0, vocab // 2)).engine
    assert shard.budget == MIN_SHARD_KV_BUDGET
    prompt = list(range(5, 40))  # 35 tokens of K/V (46 KB each) > 1 MiB: evicted
    shard.logits(0, prompt, [])
    assert shard.evictions == 1 and shard.kv_bytes == 0


def test_a_model_that_changes_logits_after_its_head_or_slides_is_refused():
    transformers = pytest.importorskip("transformers")
    from pp1q.core.errors import LocalProtocolError, Reason
    from pp1q.models.hf_shard import HFShard

    def tiny(layer="full_attention", **extra):
        torch.manual_seed(0)
        cfg = transformers.Gemma2Config(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, head_dim=8, layer_types=[layer],
            **extra)
        return transformers.Gemma2ForCausalLM(cfg).eval()

    plain = tiny(final_logit_softcapping=None)
    HFShard(plain, 0, 32, identity="tiny", kv_budget_bytes=BUDGET)  # plain head: fine
    for bad in (tiny(final_logit_softcapping=0.01),  # a tanh soft cap after the head
                tiny("sliding_attention", final_logit_softcapping=None)):  # crops differently
        with pytest.raises(LocalProtocolError) as e:
            HFShard(bad, 0, 32, identity="tiny", kv_budget_bytes=BUDGET)  # at load
        assert e.value.reason is Reason.UNSUPPORTED_FEATURE


def _one_rank(smol):
    """Decisions of one rank holding the concatenation of the split's shard logits."""
    from pp1q.verifier.ranks.sharded import ShardedDecisions
    from pp1q_kernels.shard_spmd import deliver

    class Local:  # one rank's collectives: each returns what a group of one would
        def run(self, req):
            return deliver([req])[0]

        def scatter_rows(self, rows, bounds, n_rows):
            return rows.to(torch.int64)  # the one rank's slice is the whole row

    concat = Concat([_shard(smol, lo, hi) for lo, hi in bounds(2, smol.vocab)])
    d = ShardedDecisions(concat, limits(1, smol.vocab), 0)
    d.comm, d.draws = Local(), SCENARIO_DRAWS
    return play(d, smol.tokenizer, 0)


@pytest.mark.daemons
def test_two_gloo_ranks_with_uneven_shards_decide_as_one_rank(smol, tmp_path):
    from pp1q.models.hf import export_folder

    folder = export_folder(smol, tmp_path / "smollm2")  # each rank loads it in ~1 s
    port, world = free_port(), 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SUPPORT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    codes = run_together([[sys.executable, str(SUPPORT / "hf_shard_gloo_rank.py"), str(r),
                           str(world), str(port), str(folder), str(outs[r])]
                          for r in range(world)], RUN_S, env)
    assert codes == [0] * world
    runs = [json.loads(o.read_text()) for o in outs]
    want = _one_rank(smol)
    assert all(run["results"] == want for run in runs)
    assert any(0 < a < DEPTH for a, _ in want[:4])  # a partial acceptance happened
    assert all(run["cached_tokens"] > 0 for run in runs)  # K/V reused across steps
    widest = max(hi - lo for lo, hi in bounds(world, smol.vocab))
    for run in runs:
        # the sampler's collectives carry a few integers per row (at most 2 x (D + 1));
        # the dense q scatter one shard's slice (padded to the widest) of D rows
        assert max(n for kind, _, n in run["log"] if kind != "Scatter") <= 2 * (DEPTH + 1)
        assert {n for kind, _, n in run["log"] if kind == "Scatter"} == {DEPTH * widest}
        assert widest < smol.vocab


def test_an_untied_full_head_is_freed_once_the_model_is_let_go():
    import gc
    import weakref

    transformers = pytest.importorskip("transformers")
    from pp1q.models.hf_shard import HFShard

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    head = weakref.ref(model.lm_head.weight)
    shard = HFShard(model, 16, 48, identity="tiny", kv_budget_bytes=BUDGET)
    with torch.no_grad():  # (an autograd graph would keep the head alive itself)
        want = model(input_ids=torch.tensor([[1, 2, 3]])).logits[0, -1:, 16:48]
    del model
    gc.collect()
    assert head() is None  # the rank keeps its 32 rows, not the 64-row head
    assert shard.weight.shape == (32, 16)
    with torch.no_grad():
        h = shard.lm.model(input_ids=torch.tensor([[1, 2, 3]])).last_hidden_state[0, -1:]
    assert _within_head_bound(shard.logits(0, [1, 2, 3], []), want,
                              _head_bound(h, shard.weight))


def test_an_exchanges_rows_in_one_batch_equal_each_alone(smol64, story_ids):
    shard = _shard(smol64, 20000, 49152)
    a, b = story_ids[:9], story_ids[3:15]  # two slots, caches of different lengths
    shard.logits(0, a, [])  # slot 0 has a cache; slot 1 starts empty
    requests = [(0, a + [11], [262, 314]), (1, b, [5]), (2, a[:4], [])]
    shard.prepare(requests)
    for slot, prefix, drafts in requests:
        got = shard.logits(slot, prefix, drafts)  # the prepared rows
        want = _full_rows(smol64, prefix + drafts, len(drafts) + 1)[:, 20000:]
        assert max_diff(got, want) <= CACHE_TOLERANCE, slot
    # the batch's grown caches serve the next rounds; a request other than the one
    # prepared is computed afresh, never answered with the prepared rows
    shard.prepare([(0, a + [11, 262, 7], [8]), (1, b + [5, 6], [])])
    for slot, prefix, drafts in [(0, a + [11, 262, 7], [9]), (1, b + [5, 6], [])]:
        got = shard.logits(slot, prefix, drafts)
        want = _full_rows(smol64, prefix + drafts, len(drafts) + 1)[:, 20000:]
        assert max_diff(got, want) <= CACHE_TOLERANCE, slot
    assert shard.cached_tokens >= len(a) + len(b)  # the batch reused the slots' K/V


def test_an_exchanges_decisions_share_one_batch_and_decide_as_alone(smol, story_ids):
    """ShardedRankState.votes prepares the exchange's deciding ops in one batch (a spy
    on the shard seam sees it) and decides them as exchanges of one op each do."""
    import dataclasses

    import numpy as np

    from pp1q.core.prefix import Prefix
    from pp1q.core.q import build_row
    from pp1q.verifier.ranks.ops import Form, Op, OpKind
    from pp1q.verifier.ranks.sharded import sharded_state
    from pp1q.verifier.ranks.votes import Verdict
    from pp1q_kernels.shard_spmd import deliver

    class Local:  # a group of one rank
        def run(self, req):
            return deliver([req])[0]

    class Spy:  # the HFShard seam, recording each batch
        def __init__(self, shard):
            self.shard, self.batches = shard, []
            self.lo, self.hi, self.identity = shard.lo, shard.hi, shard.identity

        def prepare(self, requests):
            self.batches.append(len(requests))
            self.shard.prepare(requests)

        def logits(self, *a):
            return self.shard.logits(*a)

        def close(self, slot):
            self.shard.close(slot)

    lim = dataclasses.replace(limits(1, smol.vocab), slots=2)
    prompts = [story_ids[:7], story_ids[2:12]]

    def state_of(spy):
        st = sharded_state(0, lim, spy, 0.0)
        st.decisions.comm, st.decisions.draws = Local(), SCENARIO_DRAWS
        for slot, prompt in enumerate(prompts):
            st.apply(Op(OpKind.OPEN, slot, seed=5 + slot, prefix_len=len(prompt),
                        prefix_digest=Prefix(prompt).digest,
                        prompt=np.asarray(prompt, np.int32)), Verdict(True))
        return st

    def ops_for(st, kind):
        g, out = np.random.default_rng(3), []  # the same q rows for both states
        for slot in (0, 1):
            s = st.slots[slot]
            head = dict(prefix_len=len(s.prefix), prefix_digest=s.prefix.digest)
            if kind is OpKind.TARGET_ONLY:
                out.append(Op(kind, slot, 1, 2, **head))
                continue
            drafts = [int(t) for t in story_ids[len(s.prefix):len(s.prefix) + 2]]
            rows = []
            for x in drafts:
                logits = g.normal(0, 1.0, smol.vocab)
                logits[x] += 6.0
                rows.append(build_row(logits, top_k=16))
            out.append(Op(kind, slot, 1, 1, drafts=np.asarray(drafts, np.int32),
                          rows=tuple((Form.SPARSE, *r.to_sparse()) for r in rows), **head))
        return out

    batched, alone = Spy(_shard(smol, 0, smol.vocab)), Spy(_shard(smol, 0, smol.vocab))
    together, apart = state_of(batched), state_of(alone)
    for kind in (OpKind.ROUND, OpKind.TARGET_ONLY):
        ops = ops_for(together, kind)
        votes = together.votes(ops)
        assert [v.tolist() for v in votes] == [apart.votes([op])[0].tolist() for op in ops]
        for st in (together, apart):
            for op, v in zip(ops, votes, strict=True):
                drafts = [] if op.drafts is None else [int(t) for t in op.drafts]
                st.slots[op.slot].prefix.extend([*drafts[:int(v[2])], int(v[3])])
    assert batched.batches == [2, 2] and set(alone.batches) == {1}
