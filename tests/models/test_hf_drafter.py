"""HFDrafter on the real 135M model: incremental rows, q built from them, early exit, and
the worker's chunked prefill through EngineProposer.

The acceptance test runs whole rounds through pp1q's float64 reference verification
(pp1q.core.verify.verify_round with RoundKeys) with the drafter equal to the target
(early exit at every layer): if positions, caches, rollback or processors were off
anywhere, p and q would differ and drafts would be rejected."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from real_model import full_logits, max_diff

pytestmark = pytest.mark.model
pytest.importorskip("transformers", reason="real-model tests need: pip install 'pp1q[hf]'")

from pp1q.core.q import build_row, sample  # noqa: E402
from pp1q.core.rng import proposal_u24  # noqa: E402
from pp1q.core.verify import RoundKeys, verify_round  # noqa: E402
from pp1q.models.engine import check_pair  # noqa: E402
from pp1q.models.hf_cache import GROWTH, MIN_SPARE  # noqa: E402
from pp1q.models.hf_drafter import HFDrafter, early_exit_view, num_layers  # noqa: E402
from pp1q.models.hf_target import HFTarget  # noqa: E402
from pp1q.models.processors import processed_probs  # noqa: E402
from pp1q.models.proposal import propose  # noqa: E402
from pp1q.wire import Step  # noqa: E402
from pp1q.worker import engine_proposer  # noqa: E402
from pp1q.worker.engine_proposer import EngineProposer  # noqa: E402
from pp1q.worker.proposer import ProposalSpec  # noqa: E402

TOL = 1e-4


def test_rows_after_commit_and_reset_equal_uncached(smol64, story_ids):
    smol = smol64  # float64: see conftest.py
    drafter = HFDrafter.early_exit(smol, num_layers(smol.model))
    d = drafter
    d.open("r", story_ids)
    row = d.next_logits("r")
    assert row.shape == (smol.vocab,)
    assert max_diff(row, full_logits(smol.model, story_ids)[-1]) <= TOL
    for t in (1030, 314, 253):
        d.next_logits("r", t)
    d.append("r", 1470)
    d.commit("r", 4, 9)  # all four accepted + bonus: 1470 and 9 are fed lazily
    seq = story_ids + [1030, 314, 253, 1470, 9]
    assert max_diff(d.next_logits("r"), full_logits(smol.model, seq)[-1]) <= TOL
    d.next_logits("r", 77)
    d.commit("r", 0, 88)  # rejected at the first draft
    seq += [88]
    assert max_diff(d.next_logits("r"), full_logits(smol.model, seq)[-1]) <= TOL
    d.next_logits("r", 5)
    d.next_logits("r", 6)
    d.reset("r")  # discarded round: back to the committed prefix
    assert max_diff(d.next_logits("r"), full_logits(smol.model, seq)[-1]) <= TOL
    assert max_diff(d.next_logits("r", 12), full_logits(smol.model, seq + [12])[-1]) <= TOL
    d.close("r")


def test_early_exit_view_shares_weights_and_exits_early(smol, story_ids):
    total = num_layers(smol.model)
    full = early_exit_view(smol.model, total)
    assert max_diff(full_logits(full, story_ids), full_logits(smol.model, story_ids)) == 0.0
    shallow = early_exit_view(smol.model, 8)
    assert num_layers(shallow) == 8 and num_layers(smol.model) == total  # target untouched
    assert shallow.lm_head.weight is smol.model.lm_head.weight
    out = full_logits(shallow, story_ids)
    assert torch.isfinite(out).all() and max_diff(out, full_logits(smol.model, story_ids)) > 1.0
    drafter = HFDrafter.early_exit(smol, 8)
    assert drafter.identity.endswith(f":early-exit=8/{total}")
    drafter.open(0, story_ids)
    assert max_diff(drafter.next_logits(0), out[-1]) <= TOL
    with pytest.raises(ValueError):
        early_exit_view(smol.model, total + 1)


def test_q_is_build_row_of_the_drafters_own_logits(smol64, story_ids):
    smol = smol64
    drafter = HFDrafter.early_exit(smol, 12)
    drafter.open("r", story_ids)
    spec = ProposalSpec(seed=11, generation=0, round_id=3, first_position=len(story_ids), depth=5,
                        temperature=0.7, top_k=64)
    steps = list(propose(drafter, "r", spec))
    assert len(steps) == spec.depth
    prefix = list(story_ids)
    for i, step in enumerate(steps):
        again = build_row(step.logits, temperature=0.7, top_k=64)
        assert np.array_equal(step.row.ids, again.ids)
        assert np.array_equal(step.row.counts, again.counts)
        assert step.token == sample(step.row, proposal_u24(11, 0, 3, spec.first_position + i))
        # and those logits are the drafter's row after x_1..x_{i-1}
        ref = full_logits(early_exit_view(smol.model, 12), prefix)[-1]
        assert max_diff(step.logits, ref) <= TOL
        prefix.append(step.token)
    drafter.commit("r", spec.depth, 3)  # every draft was recorded, the last by append
    assert max_diff(drafter.next_logits("r"),
                    full_logits(early_exit_view(smol.model, 12), prefix + [3])[-1]) <= TOL


def test_drafter_equal_to_target_accepts_nearly_everything(smol, story_ids):
    drafter = HFDrafter.early_exit(smol, num_layers(smol.model))
    target = HFTarget.from_checkpoint(smol)
    check_pair(drafter, target)
    temperature, top_k, depth = 0.8, 50, 4
    prompts = {0: story_ids, 1: story_ids[:7], 2: story_ids[5:]}
    committed = {}
    for key, ids in prompts.items():
        drafter.open(key, ids)
        target.open(key, ids)
        committed[key] = list(ids)
    drafted = accepted = 0
    for round_id in range(3):
        batch, rows = [], {}
        for key in prompts:
            spec = ProposalSpec(seed=100 + key, generation=0, round_id=round_id,
                                first_position=len(committed[key]), depth=depth,
                                temperature=temperature, top_k=top_k)
            steps = list(propose(drafter, key, spec))
            rows[key] = steps
            batch.append((key, [s.token for s in steps]))
        scored = target.score(batch)
        for (key, drafts), logits in zip(batch, scored, strict=True):
            p = processed_probs(logits, temperature, top_k).numpy()
            keys = RoundKeys(seed=100 + key, generation=0, round_id=round_id,
                             first_position=len(committed[key]))
            d = verify_round(p, [s.row for s in rows[key]], drafts, keys)
            drafted += depth
            accepted += d.accepted
            drafter.commit(key, d.accepted, d.token)
            target.commit(key, d.accepted, d.token)
            committed[key] += drafts[: d.accepted] + [d.token]
    assert drafted == 36
    assert accepted >= 0.99 * drafted, (accepted, drafted)
    text = smol.tokenizer.decode(committed[0][len(prompts[0]):])
    assert text.strip()  # something readable came out


class _Recording(HFDrafter):
    """HFDrafter keeping what its prompt calls took and every row it returned."""

    def open(self, request, committed) -> None:
        self.calls = [*getattr(self, "calls", []), ("open", len(committed))]
        super().open(request, committed)

    def extend(self, request, committed) -> None:
        self.calls.append(("extend", len(committed)))
        super().extend(request, committed)

    def next_logits(self, request, token=None) -> torch.Tensor:
        out = super().next_logits(request, token)
        self.rows = [*getattr(self, "rows", []), out.clone()]
        return out


def _chunked(smol, ids, stop_after: int | None):
    """The worker's EngineProposer over an early exit: one STEP's rows after a chunked
    prefill, stopped after ``stop_after`` chunks (a RESET) and resumed by the next STEP."""
    drafter = _Recording.early_exit(smol, 8)
    proposer = EngineProposer(drafter)
    step = Step(session=1, slot=0, generation=1, round_id=1, last_committed=len(ids) - 1,
                first_position=len(ids), prefix_digest=0, depth=4, temperature=0.8,
                top_k=64, context_version=0, seed=11)
    if stop_after is not None:
        pieces = proposer.prepare(step, ids)
        for _ in range(stop_after):
            next(pieces)
        pieces.close()
    for _ in proposer.prepare(step, ids):
        pass
    rows = [(t, tuple(r.ids), tuple(r.counts)) for t, r in proposer.rows(step, ids)]
    return rows, drafter


def test_a_chunked_prefill_stopped_and_resumed_drafts_as_one_left_alone(smol64, story_ids,
                                                                       monkeypatch):
    # the worker's chunked prefill (EngineProposer.prepare), in chunks of 4 ids here: a
    # prefill a RESET stopped after two chunks and the next STEP resumed (by extend) gives
    # the same rows, bit for bit, as one never stopped; both are within TOL of a prompt
    # opened whole (float sums in another order), and q is built from the rows returned
    monkeypatch.setattr(engine_proposer, "PREFILL_CHUNK", 4)
    ids = list(story_ids)
    assert len(ids) > 3 * 4
    alone, a = _chunked(smol64, ids, None)
    resumed, b = _chunked(smol64, ids, 2)
    assert [c[0] for c in b.calls] == ["open"] + ["extend"] * (len(b.calls) - 1)
    assert b.calls == a.calls and sum(n for _, n in a.calls) == len(ids)
    assert resumed == alone
    assert len(a.rows) == len(b.rows) == 4
    assert all(torch.equal(x, y) for x, y in zip(a.rows, b.rows, strict=True))
    whole = HFDrafter.early_exit(smol64, 8)
    whole.open("w", ids)
    assert max_diff(whole.next_logits("w"), a.rows[0]) <= TOL
    assert max_diff(a.rows[0], full_logits(early_exit_view(smol64.model, 8), ids)[-1]) <= TOL


def test_kv_bytes_are_the_cached_tokens_k_and_v(smol):
    """What the worker's K/V budget counts: per position of its buffers, each of the
    exit's layers holds a key and a value of kv_heads x head_dim floats; the buffers
    hold the cached tokens and room to append in place (pp1q.models.hf_cache: at most
    GROWTH times the tokens, plus MIN_SPARE); nothing for an unknown or closed request."""
    cfg = smol.model.config
    k = 28
    drafter = HFDrafter.early_exit(smol, k)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = k * 2 * cfg.num_key_value_heads * head_dim * 4  # float32
    room = max(int(39 * GROWTH), 39 + MIN_SPARE)  # the first append's buffer
    assert drafter.kv_bytes("r") == 0
    drafter.open("r", list(range(1, 41)))  # every committed token but the last is cached
    assert drafter.kv_bytes("r") == room * per_token
    drafter.next_logits("r")
    drafter.next_logits("r", 7)  # the first row feeds the last committed token, then 7:
    assert drafter.kv_bytes("r") == room * per_token  # 41 positions, in the same room
    drafter.close("r")
    assert drafter.kv_bytes("r") == 0
