"""Rank exchanges without torch.distributed (no process group): op bytes
(pp1q.verifier.ranks.ops), votes and verdicts (pp1q.verifier.ranks.votes) and the replica
(pp1q.verifier.ranks.replica), with several RankStates standing in for ranks."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import ConfigError, Reason, RemoteProtocolError
from pp1q.core.prefix import Prefix
from pp1q.core.q import build_row
from pp1q.core.verify import RoundKeys
from pp1q.models.processors import Processors
from pp1q.models.toy import ToySpec, ToyTarget
from pp1q.verifier import rounds
from pp1q.verifier.ranks import ops as rank_ops
from pp1q.verifier.ranks import votes as rank_votes
from pp1q.verifier.ranks.launch import DRAW_SECRET, share_draw_secret
from pp1q.verifier.ranks.ops import ENVELOPE_BYTES, Form, Limits, Op, OpKind
from pp1q.verifier.ranks.replica import RankDecisions, RankState

VOCAB = 64
LIMITS = Limits(world=2, slots=4, depth=5, vocab=VOCAB, dense_len=VOCAB, max_support=32)
TARGET = ToyTarget(ToySpec(vocab=VOCAB, seed=0))
PROMPT = [3, 7, 11]
SEED = 2026


def _buffers(limits=LIMITS):
    return (np.zeros(ENVELOPE_BYTES, np.uint8),
            np.zeros(limits.max_body - (ENVELOPE_BYTES - rank_ops.HEAD_BYTES), np.uint8))


def _roundtrip(ops, seq=1, flags=0, limits=LIMITS):
    env, over = _buffers(limits)
    n = rank_ops.pack(seq, ops, flags, env, over)
    head = rank_ops.read_head(env, limits)
    assert head.overflow_len == n and head.seq == seq and head.flags == flags
    return rank_ops.decode(head, rank_ops.body_of(head, env, over), limits), env, over


T1 = Processors()  # T = 1, no top-k/top-p


def _open(slot=0, prompt=PROMPT, decider=0, greedy=False, processors=T1):
    return Op(OpKind.OPEN, slot, seed=SEED, decider=decider, greedy=greedy,
              prefix_len=len(prompt), prefix_digest=Prefix(prompt).digest,
              prompt=np.asarray(prompt, np.int32), processors=processors)


def _proposal(prefix: list[int], depth=3, top_k=8, seed=5):
    """Draft ids and their rows, drawn from a toy drafter stand-in (target logits)."""
    rng = np.random.default_rng(seed)
    drafts, rows = [], []
    for _ in range(depth):
        row = build_row(TARGET.logits(prefix + drafts, [])[0] * 0.5, top_k=top_k)
        tok = int(rng.choice(row.ids, p=row.counts / row.counts.sum()))
        drafts.append(tok)
        rows.append(row)
    return drafts, rows


def _round(slot, prefix, drafts, rows, dense=False, generation=1, round_id=1, decider=1):
    wire = tuple((Form.DENSE, None, r.to_dense()) if dense
                 else (Form.SPARSE, *r.to_sparse()) for r in rows)
    return Op(OpKind.ROUND, slot, generation, round_id, decider, seed=SEED,
              prefix_len=len(prefix), prefix_digest=Prefix(prefix).digest,
              drafts=np.asarray(drafts, np.int32), rows=wire)


def _exchange(states, ops, seq):
    """One exchange among in-memory ranks: rank 0 keeps its ops, the others decode."""
    decoded, *_ = _roundtrip(ops, seq)
    votes = np.zeros((len(states), 1 + len(ops), rank_votes.VOTE_WORDS), np.int64)
    for st_ in states:
        mine = ops if st_.rank == 0 else decoded
        votes[st_.rank, 0] = rank_votes.presence(seq, st_.rank)
        for i, op in enumerate(mine):
            votes[st_.rank, 1 + i] = st_.vote(op)
    verdicts = rank_votes.verdicts(ops, votes, seq, states[0].limits)
    for st_ in states:
        for op, v in zip(ops if st_.rank == 0 else decoded, verdicts, strict=True):
            assert st_.apply(op, v)
    return verdicts


DRAWS = DrawKeys(bytes(range(32)))  # the group's draw secret (shared at join)


def _decisions(draws=DRAWS):
    d = RankDecisions(TARGET, LIMITS)
    d.draws = draws
    return d


def _ranks():
    return [RankState(r, LIMITS, _decisions()) for r in range(LIMITS.world)]


# -- bytes ----------------------------------------------------------------------------


def test_ops_roundtrip_sparse_dense_and_control():
    drafts, rows = _proposal(PROMPT)
    ops = [_open(0), _round(1, PROMPT, drafts, rows), _round(2, PROMPT, drafts, rows, True),
           Op(OpKind.INVALIDATE, 3, 4, seed=SEED, reason=Reason.STEP_TIMEOUT),
           ]
    out, *_ = _roundtrip(ops, seq=7)
    assert [o.kind for o in out] == [o.kind for o in ops]
    assert list(out[0].prompt) == PROMPT and out[0].seed == SEED
    assert list(out[1].drafts) == drafts and out[3].reason is Reason.STEP_TIMEOUT
    for form, op in ((Form.SPARSE, out[1]), (Form.DENSE, out[2])):
        assert [f for f, _i, _q in op.rows] == [form] * len(rows)
    ids, q = out[1].rows[0][1], out[1].rows[0][2]
    assert np.array_equal(ids, rows[0].to_sparse()[0]) and np.array_equal(q, rows[0].to_sparse()[1])
    assert np.array_equal(out[2].rows[2][2], rows[2].to_dense())


def test_a_large_batch_spills_into_one_overflow_broadcast():
    limits = Limits(world=2, slots=4, depth=5, vocab=8192, dense_len=8192, max_support=32)
    row = build_row(np.zeros(8192), top_k=None)
    op = Op(OpKind.ROUND, 0, 1, 1, 0, prefix_len=1, prefix_digest=Prefix([1]).digest,
            drafts=np.array([5] * 5, np.int32), rows=((Form.DENSE, None, row.to_dense()),) * 5)
    out, env, over = _roundtrip([op], limits=limits)
    assert rank_ops.read_head(env, limits).overflow_len > 0
    assert np.array_equal(out[0].rows[4][2], row.to_dense())


def test_corrupt_envelope_is_refused():
    env, over = _buffers()
    rank_ops.pack(1, [_open()], 0, env, over)
    head = rank_ops.read_head(env, LIMITS)
    env[rank_ops.HEAD_BYTES + 20] ^= 1
    with pytest.raises(RemoteProtocolError) as e:
        rank_ops.body_of(head, env, over)
    assert e.value.reason is Reason.CHECKSUM_MISMATCH


@pytest.mark.parametrize("field, value, reason", [
    ("slot", 4, Reason.SLOT_OUT_OF_RANGE),
    ("decider", 2, Reason.UNEXPECTED_SIZE),
])
def test_out_of_bounds_ops_are_refused(field, value, reason):
    op = Op(**{"kind": OpKind.CLOSE, "slot": 0, "seed": SEED, field: value})
    with pytest.raises(RemoteProtocolError) as e:
        _roundtrip([op])
    assert e.value.reason is reason


def test_open_carries_the_exact_processors():
    t = 0.7000000000000001  # not a float32: the FP64 the API decoded, bit for bit
    sent = [Processors(t), Processors(), Processors(1.3, top_k=7, top_p=0.25)]
    out, *_ = _roundtrip([_open(i, processors=p) for i, p in enumerate(sent)])
    assert [o.processors for o in out] == sent


@pytest.mark.parametrize("t, top_k, top_p, reason", [
    (0.0, 0, 1.0, Reason.BAD_TEMPERATURE), (-1.0, 0, 1.0, Reason.BAD_TEMPERATURE),
    (float("nan"), 0, 1.0, Reason.BAD_TEMPERATURE), (100.5, 0, 1.0, Reason.BAD_TEMPERATURE),
    (1.0, 0, 0.0, Reason.BAD_TOP_P), (1.0, 0, 1.5, Reason.BAD_TOP_P),
    (1.0, 0, float("nan"), Reason.BAD_TOP_P)])
def test_an_open_with_bad_processors_is_refused(t, top_k, top_p, reason):
    env, over = _buffers()
    rank_ops.pack(1, [_open(0)], 0, env, over)  # then the processors' bytes are rewritten
    at = rank_ops.HEAD_BYTES + 52 + 4 * len(PROMPT)
    env[at:at + 20] = np.frombuffer(struct.pack("<dId", t, top_k, top_p), np.uint8)
    head = rank_ops.read_head(env, LIMITS)
    with pytest.raises(RemoteProtocolError) as e:  # the checksum is of the body as sent
        rank_ops.decode(head, env[rank_ops.HEAD_BYTES:rank_ops.HEAD_BYTES + head.body_len]
                        .tobytes(), LIMITS)
    assert e.value.reason is reason


@pytest.mark.parametrize("processors", [Processors(0.5), Processors(1.3, top_k=5, top_p=0.6)])
def test_replicated_ranks_apply_the_requests_processors_as_one_process(processors):
    # the OPEN's processors reach every replica; the decider applies them through
    # TargetRows, as one process does (before: a replica sampled at T = 1 whatever the
    # request asked, then refused them)
    ranks = _ranks()
    _exchange(ranks, [_open(0, processors=processors),
                      _open(1, decider=1, processors=processors)], 1)
    t = Op(OpKind.TARGET_ONLY, 0, 3, 9, 0, seed=SEED, prefix_len=3,
           prefix_digest=Prefix(PROMPT).digest)
    drafts, rows = _proposal(PROMPT)
    r = _round(1, PROMPT, drafts, rows, decider=1)
    vt, vr = _exchange(ranks, [t, r], 2)
    assert vt.ok and vr.ok
    p_one = processors.probs(torch.from_numpy(TARGET.logits(PROMPT, []))).numpy()[0]
    assert vt.token == rounds.target_only(p_one, DRAWS.seed_for(SEED), 3, 9, 3, False).token
    p = processors.probs(torch.from_numpy(TARGET.logits(PROMPT, drafts))).numpy()
    one = rounds.sampled(p, rows, drafts, RoundKeys(DRAWS.seed_for(SEED), 1, 1, len(PROMPT)))
    assert (vr.accepted, vr.token) == (one.accepted, one.token)
    for st_ in ranks:
        assert st_.slots[1].prefix.tokens == PROMPT + drafts[: vr.accepted] + [vr.token]


def test_two_ops_of_one_slot_in_one_exchange_are_refused():
    with pytest.raises(RemoteProtocolError) as e:
        _roundtrip([Op(OpKind.CLOSE, 1), Op(OpKind.CLOSE, 1)])
    assert e.value.reason is Reason.SLOT_OUT_OF_RANGE


def test_declared_lengths_are_checked_before_use():
    env, over = _buffers()
    rank_ops.pack(1, [], 0, env, over)
    big = LIMITS.max_body + 1
    env[24:28] = np.frombuffer(np.uint32(big).tobytes(), np.uint8)  # body length field
    with pytest.raises(RemoteProtocolError) as e:
        rank_ops.read_head(env, LIMITS)
    assert e.value.reason is Reason.FRAME_TOO_LARGE


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=600), st.integers(0, 40))
def test_arbitrary_bodies_decode_or_raise_remote_protocol_error(junk, n_ops):
    head = rank_ops.Head(n_ops=n_ops % 5, flags=0, seq=1, body_len=len(junk),
                         overflow_len=0, checksum=0)
    try:
        ops = rank_ops.decode(head, junk, LIMITS)
    except RemoteProtocolError:
        return
    assert len(ops) == head.n_ops


# -- votes, verdicts, replicas ------------------------------------------------------


def test_every_rank_commits_the_deciders_decision_and_it_is_the_one_process_decision():
    ranks = _ranks()
    assert all(v.ok for v in _exchange(ranks, [_open(1, decider=1)], 1))
    drafts, rows = _proposal(PROMPT)
    op = _round(1, PROMPT, drafts, rows, decider=1)
    (v,) = _exchange(ranks, [op], 2)
    assert v.ok and ranks[1].decided == 1 and ranks[0].decided == 0
    p = TARGET.probs(PROMPT, drafts)
    expected = rounds.sampled(p, rows, drafts,
                              RoundKeys(DRAWS.seed_for(SEED), 1, 1, len(PROMPT)))
    assert (v.accepted, v.token) == (expected.accepted, expected.token)
    tokens = PROMPT + drafts[: v.accepted] + [v.token]
    for r in ranks:
        assert r.slots[1].prefix.tokens == tokens


def test_target_only_and_greedy_decisions_match_one_process():
    ranks = _ranks()
    _exchange(ranks, [_open(0), _open(1, decider=1, greedy=True)], 1)
    t = Op(OpKind.TARGET_ONLY, 0, 3, 9, 0, seed=SEED, prefix_len=3,
           prefix_digest=Prefix(PROMPT).digest)
    g = Op(OpKind.ROUND, 1, 1, 1, 1, greedy=True, seed=SEED, prefix_len=3,
           prefix_digest=Prefix(PROMPT).digest, drafts=np.array([1, 2], np.int32))
    vt, vg = _exchange(ranks, [t, g], 2)
    p = TARGET.probs(PROMPT, [])[0]
    assert vt.token == rounds.target_only(p, DRAWS.seed_for(SEED), 3, 9, 3, False).token
    g1 = rounds.greedy(TARGET.logits(PROMPT, [1, 2]), [1, 2])
    assert (vg.accepted, vg.token) == (g1.accepted, g1.token)


def test_a_replica_without_the_group_secret_refuses_to_decide():
    # fail closed: never a fallback to the seed the worker knows
    ranks = [RankState(r, LIMITS, _decisions(None if r == 1 else DRAWS))
             for r in range(LIMITS.world)]
    _exchange(ranks, [_open(1, decider=1)], 1)
    drafts, rows = _proposal(PROMPT)
    (v,) = _exchange(ranks, [_round(1, PROMPT, drafts, rows, decider=1)], 2)
    assert not v.ok and v.reason is Reason.RNG_KEY_OUT_OF_RANGE
    assert all(r.slots[1].prefix.tokens == PROMPT for r in ranks)  # nothing committed


def test_the_draw_secret_travels_in_rank_0s_join_record_and_is_dropped_from_all():
    records = [{"pp1q": "x", DRAW_SECRET: DRAWS.hex()}, {"pp1q": "x", DRAW_SECRET: "00" * 32}]
    got = share_draw_secret(records)
    assert got.fingerprint == DRAWS.fingerprint  # rank 0's, whatever another rank sent
    assert all(DRAW_SECRET not in r for r in records)  # healthz and logs never see it
    assert DRAWS.hex() not in repr(got)
    with pytest.raises(ConfigError):
        share_draw_secret([{"pp1q": "x"}, {"pp1q": "x"}])


def test_a_rank_with_another_committed_prefix_refuses_and_nobody_commits():
    ranks = _ranks()
    _exchange(ranks, [_open(0)], 1)
    ranks[1].slots[0].prefix.extend([9])  # rank 1 committed something rank 0 did not
    drafts, rows = _proposal(PROMPT)
    (v,) = _exchange(ranks, [_round(0, PROMPT, drafts, rows, decider=0)], 2)
    assert not v.ok and v.rank == 1 and v.reason is Reason.CHECKSUM_MISMATCH
    assert ranks[0].slots[0].prefix.tokens == PROMPT  # rank 0 discarded its own decision


def test_an_invalidated_generation_is_never_verified_again():
    ranks = _ranks()
    _exchange(ranks, [_open(2)], 1)
    inv = Op(OpKind.INVALIDATE, 2, 1, seed=SEED, reason=Reason.CHECKSUM_MISMATCH,
             prefix_len=3, prefix_digest=Prefix(PROMPT).digest)
    assert _exchange(ranks, [inv], 2)[0].ok
    assert all(r.invalidations == 1 for r in ranks)
    drafts, rows = _proposal(PROMPT)
    (v,) = _exchange(ranks, [_round(2, PROMPT, drafts, rows, generation=1)], 3)
    assert not v.ok and v.reason is Reason.STALE_GENERATION
    assert _exchange(ranks, [_round(2, PROMPT, drafts, rows, generation=2)], 4)[0].ok


def test_an_invalid_row_on_the_decider_is_a_refusal_not_a_decision():
    ranks = _ranks()
    _exchange(ranks, [_open(0, decider=1)], 1)
    drafts, rows = _proposal(PROMPT)
    op = _round(0, PROMPT, drafts, rows, decider=1)
    bad = op.rows[0][2].copy()
    bad[0] = np.float32(0.5)  # mass no longer 1
    op = Op(**{**vars(op), "rows": ((Form.SPARSE, op.rows[0][1], bad), *op.rows[1:])})
    (v,) = _exchange(ranks, [op], 2)
    assert not v.ok and v.rank == 1 and v.reason is Reason.WRONG_MASS


def test_a_draft_outside_its_row_is_a_refusal_on_the_decider():
    ranks = _ranks()
    _exchange(ranks, [_open(1, decider=1)], 1)
    drafts, rows = _proposal(PROMPT)
    drafts[0] = next(t for t in range(VOCAB) if rows[0].count_of(t) == 0)  # q(x) = 0
    (v,) = _exchange(ranks, [_round(1, PROMPT, drafts, rows, decider=1)], 2)
    assert not v.ok and v.rank == 1 and v.reason is Reason.ZERO_Q_AT_TOKEN
    assert all(r.slots[1].prefix.tokens == PROMPT for r in ranks)


def test_an_out_of_range_decision_is_refused_by_every_rank_alike():
    op = Op(OpKind.TARGET_ONLY, 0, 1, 1, 1, prefix_len=3)
    votes = np.zeros((2, 2, rank_votes.VOTE_WORDS), np.int64)
    for r in range(2):
        votes[r, 0] = rank_votes.presence(5, r)
        votes[r, 1] = rank_votes.yes()
    votes[1, 1] = rank_votes.yes(0, VOCAB, 4, 123)  # token == vocab
    (v,) = rank_votes.verdicts([op], votes, 5, LIMITS)
    assert not v.ok and v.reason is Reason.ID_OUT_OF_RANGE


def test_a_rank_at_another_exchange_loses_the_group():
    votes = np.zeros((2, 1, rank_votes.VOTE_WORDS), np.int64)
    votes[0, 0] = rank_votes.presence(5, 0)
    votes[1, 0] = rank_votes.presence(4, 1)
    with pytest.raises(RemoteProtocolError) as e:
        rank_votes.verdicts([], votes, 5, LIMITS)
    assert e.value.reason is Reason.OUT_OF_ORDER


def test_a_missed_close_makes_the_next_open_refused():
    ranks = _ranks()
    _exchange(ranks, [_open(3)], 1)
    (v,) = _exchange(ranks, [_open(3)], 2)
    assert not v.ok and v.reason is Reason.STATE_NOT_ALLOWED
    assert _exchange(ranks, [Op(OpKind.CLOSE, 3)], 3)[0].ok
    assert _exchange(ranks, [_open(3)], 4)[0].ok


# -- launch forms ----------------------------------------------------------------------


def _settings(**over):
    from pp1q.runtime.settings import VerifierSettings

    return VerifierSettings(**{"rank_backend": "gloo", **over})


def test_rank_plans_of_the_three_launch_forms():
    from pp1q.verifier.ranks.launch import rank_plan

    assert rank_plan(_settings(), environ={}) is None  # one process: no torch at all
    spawn = rank_plan(_settings(ranks=2), environ={})
    assert spawn.spawn and spawn.rv.rank == 0 and spawn.rv.master == ("127.0.0.1", 0)
    explicit = rank_plan(_settings(ranks=2, rank=1, rank_master="10.0.0.2:29500"), environ={})
    assert not explicit.spawn and explicit.rv.rank == 1
    assert explicit.rv.master == ("10.0.0.2", 29500)
    torchrun = rank_plan(_settings(), environ={"RANK": "1", "WORLD_SIZE": "2",
                                                "LOCAL_RANK": "1"})
    assert torchrun.rv.master is None and (torchrun.rv.rank, torchrun.rv.world) == (1, 2)


@pytest.mark.parametrize("over, env, words", [
    ({"ranks": 2, "rank": 1}, {}, "fixed port"),
    ({"ranks": 2, "rank": 2, "rank_master": "h:1"}, {}, "outside"),
    ({"rank": 1}, {}, "needs --ranks"),
    ({"ranks": 3}, {"RANK": "0", "WORLD_SIZE": "2"}, "WORLD_SIZE is 2"),
    ({"ranks": 99}, {}, "ranks = 99: must be an integer in 1..16"),  # the struct refuses
    ({"ranks": 2, "rank_timeout_s": 0.0}, {}, "rank_timeout_s = 0.0: .* > 0"),
    ({"ranks": 2, "rank_backend": "mpi"}, {}, "one of auto, gloo, nccl"),
])
def test_inconsistent_rank_settings_are_refused(over, env, words):
    from pp1q.core.errors import ConfigError
    from pp1q.verifier.ranks.launch import rank_plan

    with pytest.raises(ConfigError, match=words):
        rank_plan(_settings(**over), environ=env)


def test_identity_records_must_agree():
    from pp1q.core.errors import ConfigError
    from pp1q.verifier.ranks.launch import check_identities, identity

    one = identity(TARGET, LIMITS, "gloo", "127.0.0.1:1")
    assert one["target"] == TARGET.identity and one["dtype"] is None  # the toy has none
    check_identities([one, {**one, "metrics": None}])  # metrics addresses may differ
    with pytest.raises(ConfigError, match="disagree on depth"):
        check_identities([one, {**one, "depth": 4}])
    with pytest.raises(ConfigError, match="disagree on dtype"):  # a real model's shards
        check_identities([{**one, "dtype": "float32"}, {**one, "dtype": "bfloat16"}])
