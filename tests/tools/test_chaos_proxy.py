"""The fault proxy without daemons: frame cutting and editing, rule schedules, fault specs,
the wire audit, and every fault kind through a real loopback connection (an in-test
upstream writes known frames; the test reads what the proxy delivers)."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
import wire_vectors
from wire_vectors import LIMITS

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.tools.chaos.audit import WireAudit
from pp1q.tools.chaos.faults import (
    BitFlip,
    Delay,
    Direction,
    Disconnect,
    Drop,
    Duplicate,
    FaultKind,
    Reorder,
    Replay,
    Rule,
    Truncate,
)
from pp1q.tools.chaos.frames import FrameCutter, Piece, flip_bit, truncate_reframed
from pp1q.tools.chaos.proxy import FaultProxy
from pp1q.tools.chaos.spec import parse_rule
from pp1q.wire import Commit, Completion, FrameDecoder, MsgType, Reply, Reset, Step, encode
from pp1q.wire.framing import HEADER_BYTES, set_payload_len

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

REPLY = MsgType.REPLY
TIMEOUT_S = 10.0  # bound on every wait on a loopback connection here


def reply(index=1, slot=0, generation=1, round_id=1, token=2, q_at_token=0.5,
          vocab=LIMITS.dense_len):
    q = np.zeros(vocab, dtype="<f4")
    q[token] = q_at_token
    q[(token + 1) % vocab] = 1.0 - q_at_token
    return Reply(session=5, slot=slot, generation=generation, round_id=round_id, index=index,
                 position=9 + index, token=token, form=1, entries=vocab, q=q)


def frames(*messages) -> bytes:
    return b"".join(encode(m) for m in messages)


def cut(data: bytes) -> list[Piece]:
    return FrameCutter().feed(data)


def indices(data: bytes) -> list[tuple[int, int]]:
    """(generation, index) of every REPLY delivered."""
    return [(m.generation, m.index) for p in cut(data) if (m := p.message()) is not None]


# -- frames ---------------------------------------------------------------------------

def test_cutter_whole_and_byte_by_byte():
    data = frames(reply(1), reply(2), reply(3))
    whole = cut(data)
    assert [p.data for p in whole] == [encode(reply(i)) for i in (1, 2, 3)]
    c = FrameCutter()
    pieces = [p for b in data for p in c.feed(bytes([b]))]
    assert [p.data for p in pieces] == [p.data for p in whole]
    assert all(p.mtype == REPLY for p in pieces) and not c.raw


def test_cutter_goes_raw_on_bad_magic_and_impossible_lengths():
    c = FrameCutter()
    assert c.feed(b"XXXX" + bytes(40)) == [Piece(b"XXXX" + bytes(40))] and c.raw
    assert c.feed(b"more") == [Piece(b"more")]
    huge = bytearray(encode(reply(1)))
    set_payload_len(huge, 1 << 31)  # declared payload 2^31: never buffered
    c = FrameCutter()
    out = c.feed(bytes(huge[:HEADER_BYTES]))
    assert c.raw and out == [Piece(bytes(huge[:HEADER_BYTES]))]


def test_flip_bit_payload_poisons_one_frame_header_breaks_the_stream():
    piece = cut(encode(reply(1)))[0]
    flipped = flip_bit(piece, "payload", 3, 2)
    assert sum(bin(a ^ b).count("1") for a, b in zip(flipped, piece.data, strict=True)) == 1
    (frame,) = _decode(flipped)
    assert frame.error.reason is Reason.CHECKSUM_MISMATCH
    with pytest.raises(RemoteProtocolError):
        _decode(flip_bit(piece, "header", 20))
    with pytest.raises(ValueError):
        flip_bit(cut(encode(Reset(session=5, slot=0, generation=1, reason="cancelled")))[0],
                 "payload", 0)


def _decode(data: bytes):
    return FrameDecoder(LIMITS).feed_frames(data)


def test_truncate_reframed_is_a_size_error_not_a_stream_error():
    piece = cut(encode(reply(1)))[0]
    short = truncate_reframed(piece, 4)
    assert len(short) == len(piece.data) - len(piece.payload) + 4
    frames_out = _decode(short)
    assert len(frames_out) == 1 and frames_out[0].error.reason is Reason.UNEXPECTED_SIZE


# -- rules and specs ------------------------------------------------------------------

def test_rule_schedule_nth_every_times():
    r = Rule(Drop(), msg_type=REPLY, nth=2, every=3, times=2)
    fired = [r.consider(Direction.TO_VERIFIER, REPLY, None) for _ in range(10)]
    assert [i + 1 for i, f in enumerate(fired) if f] == [2, 5]
    assert r.fired == 2 and r.matched == 10
    assert not r.consider(Direction.TO_WORKER, REPLY, None)  # other direction: not counted
    assert not r.consider(Direction.TO_VERIFIER, MsgType.COMPLETION, None)
    assert r.matched == 10


def test_rule_where_and_seeded_probability():
    r = Rule(Drop(), msg_type=REPLY, where={"index": 2}, every=1, times=0)
    got = [r.consider(Direction.TO_VERIFIER, REPLY, reply(i)) for i in (1, 2, 3, 2)]
    assert got == [False, True, False, True]

    def draws(seed):
        rr = Rule(Drop(), every=1, times=0, probability=0.3, rng=random.Random(seed))
        return [rr.consider(Direction.TO_VERIFIER, REPLY, None) for _ in range(200)]
    assert draws(4) == draws(4) and 20 < sum(draws(4)) < 100
    with pytest.raises(ValueError):
        Rule(Drop(), probability=0.5)  # random without a seeded generator


def test_fault_specs():
    rng = random.Random(0)
    r = parse_rule("drop:reply:index=2:every=10:times=0", rng)
    assert isinstance(r.fault, Drop) and r.msg_type is REPLY and r.where == {"index": 2}
    assert (r.every, r.times, r.nth) == (10, 0, 1)
    r = parse_rule("delay:completion:seconds=1.5:nth=3:dir=to_verifier", rng)
    assert r.fault == Delay(1.5) and r.nth == 3
    r = parse_rule("bit_flip:any:region=header:offset=4:p=0.25", rng)
    assert r.fault == BitFlip("header", 4) and r.msg_type is None and r.probability == 0.25
    for bad in ("explode:reply", "drop:nosuch", "delay:reply", "drop:reply:index",
                "drop:reply:nth=x", "drop:reply:dir=sideways"):
        with pytest.raises(ValueError):
            parse_rule(bad, rng)


# -- audit ------------------------------------------------------------------------------

def _step(depth=3, temperature=1.0, round_id=1, generation=1):
    return Step(session=5, slot=0, generation=generation, round_id=round_id, last_committed=9,
                first_position=10, prefix_digest=0, depth=depth, temperature=temperature,
                top_k=0, context_version=0, seed=1)


def _completion(rows=3):
    return Completion(session=5, slot=0, generation=1, round_id=1, first_position=10,
                      context_version=0, rows=rows, reply_bytes=0, reply_checksum=0, status=0,
                      reason="")


def _commit(accepted=2, committed=12):
    return Commit(session=5, slot=0, generation=1, round_id=1, accepted=accepted, token=1,
                  committed=committed)


def _audit(messages, poison=False, intact=True):
    audit = WireAudit()
    for to_worker, msg in messages:
        piece = cut(encode(msg))[0]
        if poison and isinstance(msg, Reply) and msg.index == 2:
            audit.poison(1, piece.message())
        audit.delivered(1, to_worker, piece, piece.message(), intact)
    return audit


def _round(rows, commit, step=None):
    return [(True, step or _step())] + [(False, r) for r in rows] + \
        [(False, _completion()), (True, commit)]


def test_audit_accepts_a_whole_intact_proposal():
    a = _audit(_round([reply(1), reply(2), reply(3)], _commit()))
    assert a.violations == [] and a.commits == 1 and a.committed_drafts == 2
    assert a.sampled_rows == 3 and a.pending() == 0


@pytest.mark.parametrize("rows, commit, why", [
    ([reply(1), reply(3)], _commit(), "rows delivered"),  # a row missing: partial
    ([reply(1), reply(2), reply(2), reply(3)], _commit(), "rows delivered"),
    ([reply(1), reply(2, q_at_token=0.0), reply(3)], _commit(), "without q"),
    ([reply(1), reply(2), reply(3)], _commit(accepted=2, committed=13), "committed 13"),
])
def test_audit_flags_partial_commits_and_missing_q(rows, commit, why):
    a = _audit(_round(rows, commit))
    assert len(a.violations) >= 1 and why in " ".join(a.violations)


def test_audit_flags_a_commit_of_a_faulted_or_unseen_proposal():
    a = _audit(_round([reply(1), reply(2), reply(3)], _commit()), poison=True)
    assert any("faulted" in v for v in a.violations)
    a = _audit([(True, _commit())])
    assert a.violations == ["COMMIT slot 0 gen 1 round 1: no STEP seen"]
    a = _audit(_round([reply(1), reply(2), reply(3)], _commit()), intact=False)
    assert a.violations


def test_audit_forgets_reset_generations():
    a = _audit([(True, _step()), (False, reply(1)),
                (True, Reset(session=5, slot=0, generation=1, reason="step_timeout"))])
    assert a.pending() == 0 and a.violations == []


# -- the proxy on loopback ------------------------------------------------------------

async def _through(rules, upstream_frames: bytes, *, first=None, audit=None, between=None,
                   prefix_dropped: bytes = b""):
    """``between(writer, proxy)`` runs in the upstream before it writes the frames."""
    """Client -> proxy -> upstream; the upstream writes ``upstream_frames`` and closes.
    Returns (bytes the client received, proxy)."""
    first = encode(_step()) if first is None else first  # whole frames: the cutter forwards them
    got_first = asyncio.get_running_loop().create_future()

    async def upstream(reader, writer):
        got_first.set_result(await reader.readexactly(len(first)))
        if between is not None:
            await between(writer, proxy)
        writer.write(upstream_frames)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    proxy = FaultProxy("127.0.0.1", server.sockets[0].getsockname()[1], audit=audit)
    proxy.rules = rules
    port = await proxy.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(prefix_dropped + first)  # ``prefix_dropped``: frames a rule drops
    assert await asyncio.wait_for(got_first, TIMEOUT_S) == first
    received = bytearray()
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), TIMEOUT_S):
            received += chunk
    except ConnectionResetError:
        pass
    writer.close()
    await proxy.stop()
    server.close()
    return bytes(received), proxy


THREE = frames(reply(1), reply(2), reply(3), reply(4))


@pytest.mark.parametrize("fault, want", [
    (Drop(), [1, 3, 4]),
    (Duplicate(), [1, 2, 2, 3, 4]),
    (Reorder(), [1, 3, 2, 4]),
    (Delay(1.0), [1, 3, 4, 2]),
    (BitFlip(), [1, 2, 3, 4]),
])
async def test_frame_faults_hit_exactly_the_chosen_frame(fault, want):
    rule = Rule(fault, msg_type=REPLY, where={"index": 2})
    data, proxy = await _through([rule], THREE)
    assert [i for _, i in indices(data)] == want
    assert proxy.injections == {fault.kind: 1} and rule.fired == 1
    if isinstance(fault, BitFlip):
        assert data != THREE and len(data) == len(THREE)


async def test_replay_comes_back_once_its_generation_is_dead():
    stream = frames(reply(1), reply(2), reply(1, generation=2), reply(2, generation=2))
    data, proxy = await _through([Rule(Replay(), msg_type=REPLY, where={"index": 1})], stream)
    assert indices(data) == [(1, 1), (1, 2), (1, 1), (2, 1), (2, 2)]
    assert proxy.injections == {FaultKind.REPLAY: 1}


async def test_a_replayed_copy_is_held_until_its_slot_moves_on():
    """proxy.held_replays: what the chaos matrix waits out after a row (more requests
    until every copy is released)."""
    held: list[int] = []

    async def gen_one_first(writer, proxy):
        held.append(proxy.held_replays())
        writer.write(frames(reply(1), reply(2)))
        await writer.drain()
        for _ in range(int(TIMEOUT_S / 0.01)):  # until the proxy has read and held it
            if proxy.held_replays():
                break
            await asyncio.sleep(0.01)
        held.append(proxy.held_replays())

    data, proxy = await _through([Rule(Replay(), msg_type=REPLY, where={"index": 1})],
                                 frames(reply(1, generation=2)), between=gen_one_first)
    assert held == [0, 1]
    assert indices(data) == [(1, 1), (1, 2), (1, 1), (2, 1)]  # released by generation 2
    assert proxy.injections == {FaultKind.REPLAY: 1}


async def test_truncate_and_disconnect():
    data, proxy = await _through([Rule(Truncate(keep=4), msg_type=REPLY, nth=2)], THREE)
    assert len(data) == len(THREE) - (4 * LIMITS.dense_len - 4)  # payload cut to 4 bytes
    assert proxy.injections[FaultKind.TRUNCATE] == 1
    data, proxy = await _through([Rule(Disconnect(), msg_type=REPLY, nth=2)], THREE)
    one = len(encode(reply(1)))
    assert len(data) == one + one // 2  # frame 1, half of frame 2, then RST
    assert proxy.injections == {FaultKind.DISCONNECT: 1}


async def test_context_frames_are_frames_a_rule_can_hit():
    """Revision 2: the context travels as CONTEXT frames on the wire connection, cut and
    matched like any other frame (there is no second, untouched connection any more)."""
    ctx = encode(wire_vectors.messages()["context"])
    data, proxy = await _through([Rule(Drop(), direction=Direction.TO_WORKER,
                                       msg_type=MsgType.CONTEXT, times=0, every=1)],
                                 THREE, first=encode(_step()), prefix_dropped=ctx)
    assert data == THREE and proxy.connections == 1
    assert proxy.injections == {FaultKind.DROP: 1}


async def test_blackhole_discards_and_pause_keeps():
    async def blackholed(writer, proxy):
        proxy.blackhole(Direction.TO_VERIFIER)
        proxy.pause(Direction.TO_VERIFIER)  # paused too: kept, not lost
        writer.write(encode(reply(9)))
        await writer.drain()
        proxy.unpause(Direction.TO_VERIFIER)
        while proxy.blackholed_bytes == 0:  # bounded by the test's own timeout
            await asyncio.sleep(0.01)
        proxy.unblackhole(Direction.TO_VERIFIER)

    data, proxy = await asyncio.wait_for(_through([], THREE, between=blackholed), TIMEOUT_S)
    assert [i for _, i in indices(data)] == [1, 2, 3, 4]  # reply 9 went into the hole
    assert proxy.injections == {FaultKind.BLACKHOLE: 1, FaultKind.PAUSE: 1}
    assert proxy.blackholed_bytes == len(encode(reply(9)))


async def test_audit_through_the_proxy_and_reset_all():
    audit = WireAudit()
    stream = frames(reply(1), reply(2), reply(3), _completion())
    data, proxy = await _through([Rule(Drop(), msg_type=REPLY, nth=2)], stream, audit=audit)
    assert len(cut(data)) == 3 and audit.violations == []  # no COMMIT: nothing to judge
    assert audit.pending() == 0  # the connection closed: its state is gone
    assert proxy.reset_all() == 0 and proxy.connections == 1


async def test_payload_faults_on_a_frame_without_payload_are_not_injected():
    token_only = Reply(session=5, slot=0, generation=1, round_id=1, index=1, position=10,
                       token=2, form=0, entries=0)
    stream = frames(token_only, reply(2))
    rules = [Rule(BitFlip("payload"), msg_type=REPLY, nth=1),
             Rule(Truncate(), msg_type=REPLY, nth=1)]
    data, proxy = await _through(rules, stream)
    assert data[: len(encode(token_only))] == encode(token_only)  # delivered unchanged
    assert proxy.injections == {FaultKind.TRUNCATE: 1}  # the flip found no payload
