"""A sharded rank group prefills a long prompt in chunks: RankedDecider.open sends one
PREFILL op per chunk, awaited one after another, so other slots' ops run in the
exchanges between two chunks, every rank brings its K/V to the same boundaries, and a
request cancelled mid-prefill stops after the op in hand.

The group is a real RankGroup (its exchange thread, queue and futures) over two toy
vocabulary shards voting in threads on real op bytes (rank_threads.InProcessCollective),
each shard wrapped in a spy that keeps HFShard's accounting of what each forward feeds
(the toy keeps no K/V; the real model's rows after chunks are checked against the whole
prompt's in tests/models/test_hf_shard_prefill.py). The collective holds the exchanges
that carry a PREFILL until the test lets them through, so the order is the test's.
Planted variants: ``prefill_chunk=None`` (what every group did before: the whole prompt
fed by the first round's forward, and still what a toy group does) and a decider that
submits every chunk at once without awaiting them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import numpy as np
import pytest
from rank_threads import InProcessCollective, ThreadGroup

from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.core.prefix import Prefix
from pp1q.models.engine import PREFILL_CHUNK
from pp1q.models.toy import ToySpec, ToyTarget
from pp1q.runtime.metrics import Metrics
from pp1q.verifier.api import GenerateRequest
from pp1q.verifier.job import Job
from pp1q.verifier.ranks import ops as rank_ops
from pp1q.verifier.ranks.decider import RankedDecider
from pp1q.verifier.ranks.group import RankGroup
from pp1q.verifier.ranks.ops import ENVELOPE_BYTES, Limits, Op, OpKind
from pp1q.verifier.ranks.sharded import sharded_state
from pp1q.verifier.ranks.votes import Verdict

VOCAB, DEPTH, WORLD, CHUNK = 41, 3, 2, 4
LIMITS = Limits(world=WORLD, slots=2, depth=DEPTH, vocab=VOCAB, dense_len=VOCAB,
                max_support=16, sharded=True)
TARGET = ToyTarget(ToySpec(vocab=VOCAB))
DRAWS = DrawKeys.from_hex("cd" * 32)
LONG = [int(i % VOCAB) for i in range(5, 5 + 10 * CHUNK + 2)]  # ten chunks, then 2 ids
SHORT = [3, 1, 4]  # within one chunk: no PREFILL
RANK_TIMEOUT_S = 8.0  # heartbeats every 2 s: none lands inside these short tests
WAIT_S = 10.0  # a bound on every wait, so a regression fails instead of hanging


class Spy:
    """A toy shard with HFShard's bookkeeping: per slot, how many prompt ids it holds
    K/V for; ``feeds`` logs what each forward would feed (slot, ids)."""

    def __init__(self, shard) -> None:
        self.shard, self.lo, self.hi = shard, shard.lo, shard.hi
        self.held: dict[int, int] = {}
        self.feeds: list[tuple[str, int, int]] = []
        self.prefills: list[tuple[int, int]] = []

    def prefill(self, slot, tokens) -> None:
        self.feeds.append(("prefill", slot, len(tokens) - min(self.held.get(slot, 0),
                                                               len(tokens))))
        self.prefills.append((slot, len(tokens)))
        self.held[slot] = len(tokens)

    def logits(self, slot, prefix, drafts):
        seq, rows = len(prefix) + len(drafts), len(drafts) + 1
        keep = min(self.held.get(slot, 0), seq - rows)
        self.feeds.append(("logits", slot, seq - keep))
        self.held[slot] = seq
        return self.shard.logits(slot, prefix, drafts)

    def close(self, slot) -> None:
        self.held.pop(slot, None)


class AllAtOnce(RankedDecider):
    """Planted: every chunk's PREFILL submitted at once, none awaited."""

    async def open(self, job: Job) -> None:
        chunk, self.prefill_chunk = self.prefill_chunk, None
        await super().open(job)  # the OPEN
        for upto in range(chunk, len(job.prefix), chunk):
            self._submit_unawaited(self._op(job, OpKind.PREFILL, upto=upto))


def _job(prompt: list[int], slot: int) -> Job:
    req = GenerateRequest(prompt=prompt, max_tokens=4, seed=slot + 1, speculative=False,
                          greedy=False, draft_temperature=1.0, top_k=None)
    return Job(req, slot)


@contextlib.asynccontextmanager
async def _started(cls=RankedDecider, chunk: int | None = CHUNK):
    """(decider, collective, rank states) of a started two-rank sharded group, stopped
    (a STOP exchange) on the way out, whatever the test did."""
    decider, coll, states = _group(cls, chunk)
    try:
        yield decider, coll, states
    finally:
        coll.hold = None
        coll.let_through(2)  # whatever is still held
        await decider.group.close()


def _group(cls, chunk):
    group_comm, states = ThreadGroup(WORLD), []
    for r in range(WORLD):
        st = sharded_state(r, LIMITS, TARGET, 0.0)
        st.decisions.comm, st.decisions.draws = group_comm.comm(r), DRAWS
        st.decisions.shard = Spy(st.decisions.shard)
        states.append(st)
    coll = InProcessCollective(states, LIMITS)
    decider = cls(TARGET, Metrics("verifier"), DRAWS, sharded=True, prefill_chunk=chunk)
    decider.group = RankGroup(coll, states[0], decider.metrics, RANK_TIMEOUT_S)
    decider.group.start()
    coll.hold = lambda ops: any(op.kind is OpKind.PREFILL for op in ops)
    return decider, coll, states


async def _until(predicate) -> bool:
    for _ in range(int(WAIT_S / 0.005)):
        if predicate():
            return True
        await asyncio.sleep(0.005)
    return False


async def _held(coll: InProcessCollective, opening: asyncio.Future) -> bool:
    """Until an exchange carrying a PREFILL is held; False when ``opening`` ends first."""
    return await _until(lambda: coll.held.acquire(blocking=False) or opening.done()) \
        and not opening.done()


async def _target_only(decider: RankedDecider, job: Job, steps: int) -> None:
    for k in range(steps):
        out = await decider.decide_target_only(job, 0, k)
        job.prefix.extend([out.token])


def _prefills(coll: InProcessCollective, slot: int) -> list[tuple[int, int]]:
    """(exchange index, upto) of ``slot``'s PREFILL ops, in order."""
    return [(i, upto) for i, ex in enumerate(coll.log) for kind, s, upto in ex
            if kind is OpKind.PREFILL and s == slot]


def _first(coll: InProcessCollective, kind: OpKind, slot: int) -> int:
    return next(i for i, ex in enumerate(coll.log) if (kind, slot) in [e[:2] for e in ex])


@pytest.mark.parametrize("chunk", [CHUNK, None], ids=["chunked", "planted-whole-prompt"])
async def test_a_long_prompt_goes_a_chunk_per_exchange_with_other_slots_between(chunk):
    async with _started(chunk=chunk) as (decider, coll, states):
        short, long = _job(SHORT, 1), _job(LONG, 0)
        await decider.open(short)  # within a chunk: no PREFILL, nothing held
        opening = asyncio.ensure_future(decider.open(long))
        held = await _held(coll, opening)  # the first chunk's exchange is in hand
        other = asyncio.ensure_future(_target_only(decider, short, 2))
        if held:  # the other slot's step waits in the queue behind the chunk in hand
            assert await _until(lambda: any(op.slot == 1 for op, _ in decider.group._pending))
        coll.hold = None  # from here on every exchange passes
        coll.let_through(int(held))
        await asyncio.wait_for(asyncio.gather(opening, other), WAIT_S)
        await asyncio.wait_for(_target_only(decider, long, 1), WAIT_S)  # its first row
    feeds = [n for r in states for kind, slot, n in r.decisions.shard.feeds if slot == 0]
    prefills = _prefills(coll, 0)
    if chunk is None:  # planted: no chunk; the first row's forward feeds the whole prompt
        assert not held and prefills == [] and max(feeds) == len(LONG)
        return
    # chunk boundaries, one PREFILL per exchange, the same on every rank
    assert [upto for _, upto in prefills] == list(range(CHUNK, len(LONG), CHUNK))
    assert len({i for i, _ in prefills}) == len(prefills)
    for r in states:
        assert r.decisions.shard.prefills == [(0, upto) for _, upto in prefills]
    # no forward of the long prompt's slot fed more than a chunk (its first row: the
    # rest of the prompt, at most a chunk), and the other slot's step ran between two
    # of its chunks instead of after the whole prompt
    assert max(feeds) <= CHUNK and sum(feeds) == WORLD * len(LONG)
    assert prefills[0][0] < _first(coll, OpKind.TARGET_ONLY, 1) < prefills[-1][0]


@pytest.mark.parametrize("cls", [RankedDecider, AllAtOnce], ids=["awaited", "planted-all-at-once"])
async def test_a_request_cancelled_mid_prefill_stops_after_the_op_in_hand(cls):
    async with _started(cls) as (decider, coll, states):
        job = _job(LONG, 0)
        opening = asyncio.ensure_future(decider.open(job))
        assert await _held(coll, opening) or cls is AllAtOnce
        opening.cancel()  # its client left while the first chunk was in hand
        with contextlib.suppress(asyncio.CancelledError):
            await opening
        decider.close(job)  # what the scheduler does as the request unwinds
        coll.hold = None
        coll.let_through()
        assert await _until(lambda: any((OpKind.CLOSE, 0) in [e[:2] for e in ex]
                                        for ex in coll.log))
    prefills = _prefills(coll, 0)
    if cls is AllAtOnce:  # planted: every chunk ran, for a client long gone
        assert len(prefills) == len(range(CHUNK, len(LONG), CHUNK))
        return
    assert [upto for _, upto in prefills] == [CHUNK]
    assert prefills[0][0] < _first(coll, OpKind.CLOSE, 0)  # queued behind it
    for r in states:
        assert 0 not in r.slots and 0 not in r.decisions.shard.held
        assert r.decisions.shard.prefills == [(0, CHUNK)]


def _open(prompt=LONG) -> Op:
    return Op(OpKind.OPEN, 0, seed=1, prefix_len=len(prompt),
              prefix_digest=Prefix(prompt).digest, prompt=np.asarray(prompt, np.int32))


def _prefill(upto: int, prompt=LONG) -> Op:
    return Op(OpKind.PREFILL, 0, seed=1, prefix_len=len(prompt),
              prefix_digest=Prefix(prompt).digest, upto=upto)


def _decode(ops):
    env, over = np.zeros(ENVELOPE_BYTES, np.uint8), np.zeros(LIMITS.max_body, np.uint8)
    rank_ops.pack(1, ops, 0, env, over)
    head = rank_ops.read_head(env, LIMITS)
    return rank_ops.decode(head, rank_ops.body_of(head, env, over), LIMITS)


def test_a_prefill_op_carries_its_boundary_and_a_bad_one_is_refused():
    (op,) = _decode([_prefill(8)])
    assert (op.kind, op.upto, op.prefix_len) == (OpKind.PREFILL, 8, len(LONG))
    for upto in (0, len(LONG), len(LONG) + 5):  # never the last id: the round feeds it
        with pytest.raises(RemoteProtocolError) as e:
            _decode([_prefill(upto)])
        assert e.value.reason is Reason.BAD_POSITION


def test_a_replica_refuses_a_prefill_that_goes_back_or_past_one_chunk():
    st = sharded_state(0, dataclasses.replace(LIMITS, world=1), TARGET, 0.0)
    long = list(range(1, 2 * PREFILL_CHUNK + 3))
    st.apply(_open(long), Verdict(True))
    assert st.check(_prefill(PREFILL_CHUNK + 1, long)) is Reason.BAD_POSITION
    assert st.check(_prefill(PREFILL_CHUNK, long)) is None
    st.apply(_prefill(PREFILL_CHUNK, long), Verdict(True))
    assert st.check(_prefill(PREFILL_CHUNK, long)) is Reason.BAD_POSITION  # not further
    assert st.check(_prefill(2 * PREFILL_CHUNK, long)) is None
    assert st.check(dataclasses.replace(_prefill(8, long), slot=1)) is Reason.STATE_NOT_ALLOWED
