"""ShardedRankState without torch.distributed: N replicas in threads, their sampler's
collectives through shard_spmd.deliver (the comm seam), ops through real op bytes.

Every rank decides every op from its vocabulary shard and the verdicts equal the
replicated group's (one rank deciding from whole rows); a rank whose replica differs
refuses and nobody enters the decision's collectives (no hang); a SHARDED row carries
no q bytes and is refused by a group that is not sharded."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
from rank_threads import BARRIER_S, ThreadGroup

from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.core.prefix import Prefix
from pp1q.core.q import build_row, sample
from pp1q.core.rng import proposal_u24
from pp1q.models.processors import Processors
from pp1q.models.toy import ToySpec, ToyTarget
from pp1q.verifier.ranks import ops as rank_ops
from pp1q.verifier.ranks import votes as rank_votes
from pp1q.verifier.ranks.ops import ENVELOPE_BYTES, Form, Limits, Op, OpKind
from pp1q.verifier.ranks.replica import RankDecisions, RankState
from pp1q.verifier.ranks.sharded import ShardedDecisions, sharded_state
from pp1q_kernels.shard_spmd import deliver

VOCAB, DEPTH, WORLD = 41, 3, 3
LIMITS = Limits(world=WORLD, slots=2, depth=DEPTH, vocab=VOCAB, dense_len=VOCAB,
                max_support=16, sharded=True)
TARGET = ToyTarget(ToySpec(vocab=VOCAB))
DRAWS = DrawKeys.from_hex("ab" * 32)
PROMPT = [3, 7]
T1 = Processors()  # T = 1, no top-k/top-p


def _states(sharded=True):
    group = ThreadGroup(WORLD)
    states = []
    for r in range(WORLD):
        if sharded:
            s = sharded_state(r, LIMITS, TARGET, 0.0)
            s.decisions.comm = group.comm(r)
        else:
            s = RankState(r, LIMITS, RankDecisions(TARGET, LIMITS))
        s.decisions.draws = DRAWS
        states.append(s)
    return states, group


def _bytes(ops, limits=LIMITS):
    env = np.zeros(ENVELOPE_BYTES, np.uint8)
    over = np.zeros(limits.max_body, np.uint8)
    rank_ops.pack(1, ops, 0, env, over)
    head = rank_ops.read_head(env, limits)
    return head, rank_ops.decode(head, rank_ops.body_of(head, env, over), limits)


def _exchange(states, ops):
    """Every rank votes (rank 0 on its own ops, the others on decoded bytes) in its own
    thread; the summed votes give the verdicts every rank applies."""
    _, decoded = _bytes(ops)
    votes = np.zeros((WORLD, 1 + len(ops), rank_votes.VOTE_WORDS), np.int64)
    errors = []

    def run(r):
        try:
            votes[r, 0] = rank_votes.presence(1, r)
            for i, v in enumerate(states[r].votes(ops if r == 0 else decoded)):
                votes[r, 1 + i] = v
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * BARRIER_S)
    assert not errors, errors
    verdicts = rank_votes.verdicts(ops, votes, 1, LIMITS)
    for r, s in enumerate(states):
        for op, v in zip(ops if r == 0 else decoded, verdicts, strict=True):
            assert s.apply(op, v)
    return verdicts


def _round(state, k: int, form: Form, generation=1):
    s = state.slots[0]
    ctx = list(s.prefix.tokens)
    rows, drafts = [], []
    for i in range(DEPTH):
        logits = TARGET.logits(ctx + drafts, [])[0] * -0.7  # a poor drafter: rejections
        row = build_row(logits, top_k=8 if form == Form.SPARSE else None)
        drafts.append(sample(row, proposal_u24(k, generation, k, len(ctx) + i)))
        rows.append(row)
    wire = tuple((Form.SPARSE, *r.to_sparse()) if form == Form.SPARSE else
                 (form, None, None) for r in rows)
    wire = tuple((f, None if i is None else i.astype(np.int32), q) for f, i, q in wire)
    return Op(OpKind.ROUND, 0, generation=generation, round_id=k, decider=0, seed=9,
              prefix_len=len(s.prefix), prefix_digest=s.prefix.digest,
              drafts=np.asarray(drafts, np.int32), rows=wire, q_rows=tuple(rows))


def _open(processors=T1):
    return Op(OpKind.OPEN, 0, seed=9, prefix_len=len(PROMPT),
              prefix_digest=Prefix(PROMPT).digest, prompt=np.asarray(PROMPT, np.int32),
              processors=processors)


def test_sharded_replicas_commit_what_one_rank_decides():
    sharded, _ = _states()
    whole = RankState(0, LIMITS, RankDecisions(TARGET, LIMITS))
    whole.decisions.draws = DRAWS
    _exchange(sharded, [_open()])
    whole.apply(_open(), rank_votes.Verdict(True))
    corrections = 0  # rounds that ended in a rejection and its correction pick
    for k in range(1, 13):
        op = _round(sharded[0], k, Form.SPARSE if k % 2 else Form.SHARDED)
        (v,) = _exchange(sharded, [op])
        assert v.ok, v
        corrections += v.accepted < DEPTH
        # the same round decided from whole rows by the replicated decider: its p is the
        # toy's numpy softmax, an ulp away at most from the sharded p, so a draw would
        # have to land within ~2^-50 of a boundary to decide differently (fixed seeds)
        want = whole.decisions.decide(op, whole.slots[0])
        assert (v.accepted, v.token) == (want.accepted, want.token)
        whole.slots[0].prefix.extend([*map(int, op.drafts[:v.accepted]), v.token])
        assert all(s.slots[0].prefix.digest == whole.slots[0].prefix.digest for s in sharded)
    assert corrections > 0  # correction picks were compared, not only bonus picks


def test_a_refusing_rank_stops_the_decision_before_any_collective():
    states, group = _states()
    _exchange(states, [_open()])
    states[2].slots[0].prefix.extend([1])  # rank 2 committed something else
    before = group.calls
    (v,) = _exchange(states, [_round(states[0], 1, Form.SHARDED)])
    assert not v.ok and v.rank == 2 and v.reason is Reason.CHECKSUM_MISMATCH
    assert group.calls == before + 1  # the agreement gather only: nobody decided


def test_q_zero_at_a_draft_is_refused_by_every_rank_alike():
    states, _ = _states()
    _exchange(states, [_open()])
    op = _round(states[0], 1, Form.SPARSE)
    row = op.q_rows[0]
    absent = next(t for t in range(VOCAB) if row.count_of(t) == 0)
    drafts = op.drafts.copy()
    drafts[0] = absent
    (v,) = _exchange(states, [dataclasses.replace(op, drafts=drafts)])
    assert not v.ok and v.reason is Reason.ZERO_Q_AT_TOKEN


def test_sharded_rows_carry_no_q_bytes_and_need_a_sharded_group():
    states, _ = _states()
    _exchange(states, [_open()])
    op = _round(states[0], 1, Form.SHARDED)
    head, (decoded,) = _bytes([op])
    assert decoded.rows == ((Form.SHARDED, None, None),) * DEPTH
    assert head.body_len < 200  # op head, drafts, row table: no VOCAB-wide row
    unsharded = Limits(**{**LIMITS.__dict__, "sharded": False})
    with pytest.raises(RemoteProtocolError) as e:
        _bytes([op], unsharded)
    assert e.value.reason is Reason.UNEXPECTED_SIZE


class OneRank:
    """The collectives of a group of one (shard_spmd.deliver over one rank's request)."""

    def run(self, req):
        return deliver([req])[0]


def test_a_slot_with_top_k_and_top_p_is_decided_as_by_one_rank():
    # every rank applies them across the shards (pp1q_kernels.shard_processors)
    states, group = _states()
    top = Processors(0.8, top_k=6, top_p=0.7)
    _exchange(states, [_open(top)])
    one = ShardedDecisions(TARGET, dataclasses.replace(LIMITS, world=1), 0)
    one.comm, one.draws = OneRank(), DRAWS
    corrections = 0
    for k in range(1, 9):
        slot = dataclasses.replace(states[0].slots[0], prefix=states[0].slots[0].prefix.copy())
        op = _round(states[0], k, Form.SPARSE)
        before = group.calls
        (v,) = _exchange(states, [op])
        want = one.decide(op, slot)
        assert v.ok and (v.accepted, v.token) == (want.accepted, want.token)
        assert group.calls > before + 4  # every rank decided, over the collectives
        corrections += v.accepted < DEPTH
    assert corrections > 0


def test_a_temperature_reaches_every_shard():
    hot, cold = _states()[0], _states()[0]
    _exchange(hot, [_open(Processors(0.02))])
    _exchange(cold, [_open()])
    differ = 0
    for k in range(1, 9):
        before = list(hot[0].slots[0].prefix.tokens)
        (a,) = _exchange(hot, [_round(hot[0], k, Form.SPARSE)])
        (b,) = _exchange(cold, [_round(cold[0], k, Form.SPARSE)])
        differ += (a.accepted, a.token) != (b.accepted, b.token)
        if a.accepted == 0:  # T = 0.02 sharpens p to its argmax: so is the correction
            assert a.token == int(np.argmax(TARGET.logits(before, [])[0]))
    assert differ > 0  # and the same rounds at T = 1 decide otherwise
