"""The sharded group applies the target's top-k / top-p to rounds and target-only steps
alike: speculative and target-only output are distributed as the processed target p.

Each rank is a production ShardedDecisions on the toy target (its own shard of the LM
head), its decision step (``ShardedDecisions.step``) run in lockstep with the others in
this process (shard_spmd.lockstep, no daemons, no threads). The first token a round
emits (x_1 accepted, else the correction) and a target-only step's token are each
checked against p from pp1q.models.processors (the one-process processors) by a
G test (tests/support/stats.py's g_test: fixed seeds, false alarms under 1e-6). The
planted bug is the one the issue warns of: a rank group whose rounds skip top-k / top-p
while its target-only steps apply them, passed as each rank's RankDecisions the way a
production group builds its own (a subclass, as tests/support/planted_ranks.py does).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from stats import g_test

from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.prefix import Prefix
from pp1q.core.q import build_row, sample
from pp1q.core.rng import proposal_u24
from pp1q.models.processors import Processors, processed_probs
from pp1q.models.toy import ToySpec, ToyTarget
from pp1q.verifier.ranks.ops import Form, Limits, Op, OpKind
from pp1q.verifier.ranks.replica import SlotReplica
from pp1q.verifier.ranks.sharded import ShardedDecisions
from pp1q_kernels.shard_processors import MAX_SHARD_TOP_K
from pp1q_kernels.shard_spmd import CollectiveLog, lockstep

VOCAB, WORLD, DEPTH = 41, 3, 2  # balanced(41, 3): shards of 13, 14 and 14 ids
TARGET = ToyTarget(ToySpec(vocab=VOCAB))
DRAWS = DrawKeys.from_hex("cd" * 32)
PROMPT = [3, 7]
TOP = Processors(1.5, top_k=8, top_p=0.8)  # keeps 4 ids: top-p cuts inside top-k
N = 300  # rounds and target-only steps each: ~3 s on two busy cores
N_SLOW = 6000


def limits(world: int = WORLD, vocab: int = VOCAB) -> Limits:
    return Limits(world=world, slots=1, depth=DEPTH, vocab=vocab, dense_len=vocab,
                  max_support=VOCAB, sharded=True)


class RoundsWithoutTopKP(ShardedDecisions):
    """Planted: rounds verify against p at the temperature alone (top-k / top-p
    dropped); target-only steps still apply them."""

    def step(self, op, s, q):
        if op.kind is OpKind.ROUND:
            s = dataclasses.replace(s, processors=Processors(s.processors.temperature))
        return super().step(op, s, q)


def group(kind=ShardedDecisions, world: int = WORLD, target=TARGET) -> list:
    out = []
    for r in range(world):
        d = kind(target, limits(world, target.vocab), r)
        d.draws = DRAWS
        out.append(d)
    return out


def decide(ranks, op: Op, slot: SlotReplica, log=None):
    got = lockstep([d.step(op, slot, d.q_of(op) if op.kind is OpKind.ROUND else None)
                    for d in ranks], log=log)
    assert len(set(got)) == 1, got  # every rank returns the same decision
    return got[0]


Q_ROWS = [build_row(TARGET.logits(PROMPT, [])[0] * 0.4, top_k=20)]  # flatter than p


def round_op(k: int) -> Op:
    """A round of DEPTH drafts after PROMPT drawn afresh from q (round id k: new draws)."""
    drafts, rows = [], []
    for i in range(DEPTH):
        row = Q_ROWS[0] if i == 0 else build_row(
            TARGET.logits(PROMPT + drafts, [])[0] * 0.4, top_k=20)
        drafts.append(sample(row, proposal_u24(k, 1, k, len(PROMPT) + i)))
        rows.append(row)
    wire = tuple((Form.SPARSE, ids.astype(np.int32), q) for ids, q in
                 (r.to_sparse() for r in rows))
    return Op(OpKind.ROUND, 0, generation=1, round_id=k, decider=0, seed=9,
              prefix_len=len(PROMPT), prefix_digest=Prefix(PROMPT).digest,
              drafts=np.asarray(drafts, np.int32), rows=wire, q_rows=tuple(rows))


def target_only_op(k: int) -> Op:
    return Op(OpKind.TARGET_ONLY, 0, generation=1, round_id=k, decider=0, seed=9,
              prefix_len=len(PROMPT), prefix_digest=Prefix(PROMPT).digest)


def first_tokens(ranks, n: int, processors: Processors = TOP) -> tuple[np.ndarray, np.ndarray]:
    """(counts of the first token of n rounds, counts of n target-only tokens)."""
    slot = SlotReplica(9, False, Prefix(PROMPT), processors=processors)
    rounds, alone = np.zeros(VOCAB, np.int64), np.zeros(VOCAB, np.int64)
    for k in range(1, n + 1):
        op = round_op(k)
        out = decide(ranks, op, slot)
        rounds[int(op.drafts[0]) if out.accepted else out.token] += 1
        alone[decide(ranks, target_only_op(k), slot).token] += 1
    return rounds, alone


def expected(processors: Processors = TOP) -> np.ndarray:
    return processors.probs(torch.from_numpy(TARGET.logits(PROMPT, [])[:1]))[0].numpy()


def run_distribution(n: int) -> None:
    p = expected()
    assert 3 <= int((p > 0).sum()) < 8  # top-p cut inside top-k: both rules decide here
    rounds, alone = first_tokens(group(), n)
    for counts in (rounds, alone):
        fit = g_test(counts, p)
        assert not fit.rejected, fit
    bad_rounds, bad_alone = first_tokens(group(RoundsWithoutTopKP), n // 4)
    assert g_test(bad_rounds, p).rejected  # tokens top-k / top-p leave out
    assert not g_test(bad_alone, p).rejected


@pytest.mark.experiment
def test_rounds_and_target_only_follow_the_processed_target():
    run_distribution(N)


@pytest.mark.slow
def test_rounds_and_target_only_follow_the_processed_target_long():
    run_distribution(N_SLOW)


@pytest.mark.parametrize("processors", [Processors(top_k=5), Processors(top_p=0.6),
                                        Processors(0.7, top_k=12, top_p=0.9)])
def test_two_and_three_ranks_decide_as_one(processors):
    slot = SlotReplica(9, False, Prefix(PROMPT), processors=processors)
    groups = [group(world=w) for w in (1, 2, 3)]
    for k in range(1, 16):
        op = round_op(k) if k % 4 else target_only_op(k)
        assert len({decide(g, op, slot) for g in groups}) == 1


def test_a_top_k_over_the_limit_is_refused_before_any_collective():
    vocab = MAX_SHARD_TOP_K + 9
    big = ToyTarget(ToySpec(vocab=vocab))
    slot = SlotReplica(9, False, Prefix(PROMPT), processors=Processors(top_k=MAX_SHARD_TOP_K + 1))
    log = CollectiveLog()
    with pytest.raises(LocalProtocolError) as e:
        decide(group(world=2, target=big), target_only_op(1), slot, log=log)
    assert e.value.reason is Reason.UNSUPPORTED_FEATURE and not log.entries
    # at the limit it is decided, and its kept ids are the one-process processors' top k
    slot = dataclasses.replace(slot, processors=Processors(top_k=MAX_SHARD_TOP_K))
    token = decide(group(world=2, target=big), target_only_op(1), slot).token
    assert processed_probs(torch.from_numpy(big.logits(PROMPT, [])[0]),
                           top_k=MAX_SHARD_TOP_K)[token] > 0
