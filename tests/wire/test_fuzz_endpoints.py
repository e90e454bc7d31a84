"""Hypothesis properties over the inputs test_wire_fuzz.py does not reach.

- the HELLO exchange on both sides, with every field of a valid HELLO / HELLO answer
  open to replacement: RemoteProtocolError or a session whose limits never exceed what
  this side offered (the limits size every buffer);
- the BufferedProtocol path (get_buffer / buffer_updated) the daemons use: clean traffic
  gives the same events as receive_data at any chunking, mutated traffic raises only
  RemoteProtocolError and never yields a sampled id without its q;
- CONTEXT frames with any control fields: refused, or held within the bounds;
- the atheris harness's own property and its checksum fix-up (fuzz/wire_atheris.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import msgspec
import pytest
import wire_vectors
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from wire_helpers import (
    PREFIX,
    PROPOSAL_SHAPES,
    config,
    context_frame,
    control_of,
    forge,
    pair,
    proposal_for,
    step,
    stepped,
    worker_frames,
    worker_proposal,
)

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.core.prefix import digest_of
from pp1q.wire import FrameDecoder, Limits, VerifierEndpoint, WorkerEndpoint, encode
from pp1q.wire.events import (
    Discarded,
    ProposalFailed,
    ProposalReady,
    SessionRefused,
    SessionStarted,
)
from pp1q.wire.framing import HEADER_BYTES
from pp1q.wire.limits import MAX_CONTROL_BYTES
from pp1q.wire.messages import MsgType

pytestmark = pytest.mark.experiment  # many-case fuzzing in process

V = wire_vectors.build()
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_spec = importlib.util.spec_from_file_location(
    "wire_atheris", Path(__file__).resolve().parents[2] / "fuzz" / "wire_atheris.py")
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)

scalars = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats()
           | st.text(max_size=80) | st.binary(max_size=16)
           | st.sampled_from([0, 1, 2, 255, 256, 1 << 31, (1 << 32) - 1, 1 << 32, -1]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=10), max_leaves=20)


BOUNDS = [0, 1, 2, 3, 4, 5, 16, 17, 20, 255, 256, 1 << 16, (1 << 31) - 1, 1 << 31,
          (1 << 32) - 1, 1 << 32, (1 << 64) - 1]
SAME_TYPE = {  # value -> strategy for another value of its type, near it or at a bound
    # near it, within what msgpack encodes (a draw past 2^64 - 1 broke the strategy itself)
    int: lambda v: st.sampled_from(BOUNDS) | st.integers(max(v - 3, -(1 << 63)),
                                                         min(v + 3, (1 << 64) - 1)),
    bool: lambda v: st.booleans(),
    str: lambda v: st.sampled_from(["", v + "x", v[:-1], v.upper()]) | st.text(max_size=80),
}


def _paths(tree, prefix=()):
    """Every position in a nested list (array_like structs decode from nested lists)."""
    for i, v in enumerate(tree):
        yield (*prefix, i)
        if isinstance(v, list):
            yield from _paths(v, (*prefix, i))


@st.composite
def mutated_tree(draw, body: bytes):
    """A msgpack body, decoded, with 1..3 positions replaced (or the rest cut short)."""
    tree = msgspec.msgpack.decode(body)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(tree))))
        parent = tree
        for i in path[:-1]:
            parent = parent[i]
        old, roll = parent[path[-1]], draw(st.integers(0, 9))
        if roll == 0:
            del parent[path[-1]:]  # missing trailing fields
        elif roll <= 6 and type(old) in SAME_TYPE:  # mostly type-preserving: past the schema
            parent[path[-1]] = draw(SAME_TYPE[type(old)](old))
        else:
            parent[path[-1]] = draw(values)
        if not tree:
            break
    return msgspec.msgpack.encode(tree)


def mutated_control(frame: bytes):
    return mutated_tree(control_of(frame))


def _events_or_remote_error(receive, *args) -> list | None:
    """``receive(*args)``'s events, or None after a RemoteProtocolError (the only error
    allowed); the outcome is recorded for --hypothesis-show-statistics."""
    try:
        events = receive(*args)
    except RemoteProtocolError as e:
        assert isinstance(e.reason, Reason)
        event(f"raised {e.reason.value}")
        return None
    event(",".join(type(e).__name__ for e in events) or "no event")
    return events


def _within(got: Limits, offered: Limits) -> bool:
    return all(getattr(got, f) <= getattr(offered, f) for f in Limits.__struct_fields__)


# -- HELLO, both sides ----------------------------------------------------------------------


@FUZZ
@given(mutated_control(V["hello"]))
def test_worker_takes_any_hello_safely_and_never_widens_its_limits(control):
    w = WorkerEndpoint(config())
    events = _events_or_remote_error(w.receive_data, forge(MsgType.HELLO, control), 0.0)
    if events is None:
        return
    assert len(events) == 1 and isinstance(events[0], SessionStarted | SessionRefused)
    answer = FrameDecoder(wire_vectors.LIMITS).feed(w.data_to_send())  # always answered
    assert len(answer) == 1
    if isinstance(events[0], SessionStarted):
        assert _within(events[0].limits, wire_vectors.LIMITS)
    else:
        assert answer[0].reason is events[0].reason and not events[0].by_peer


@FUZZ
@given(st.sampled_from(["hello_answer", "refusal"]), st.data())
def test_verifier_takes_any_hello_answer_safely_and_never_accepts_wider_limits(name, data):
    v = VerifierEndpoint(config(), session=wire_vectors.SESSION)
    v.hello()
    mtype = MsgType.HELLO_ANSWER if name == "hello_answer" else MsgType.REFUSAL
    frame = forge(mtype, data.draw(mutated_control(V[name])))
    for e in _events_or_remote_error(v.receive_data, frame, 0.0) or ():
        if isinstance(e, SessionStarted):
            assert _within(e.limits, wire_vectors.LIMITS)
            assert e.limits.dense_len == wire_vectors.LIMITS.dense_len
        else:
            assert isinstance(e, SessionRefused) and e.by_peer


def _wider(limits: Limits) -> Limits:
    return msgspec.structs.replace(limits, max_slots=limits.max_slots + 1)


def test_planted_worker_that_takes_the_peers_limits_is_caught(monkeypatch):
    # the property above, shown to fail: a worker whose negotiation keeps the HELLO's
    # limits instead of each minimum (the seam its endpoint calls) widens them
    from pp1q.wire import validate, worker_endpoint

    def peers_limits(hello, versions, identity, limits):
        return validate.choose_version(hello.versions, versions), hello.limits

    hello = msgspec.msgpack.decode(control_of(V["hello"]))
    hello[3] = list(msgspec.structs.astuple(_wider(wire_vectors.LIMITS)))  # limits: field 4
    frame = forge(MsgType.HELLO, msgspec.msgpack.encode(hello))
    events = WorkerEndpoint(config()).receive_data(frame, 0.0)
    assert isinstance(events[0], SessionStarted) and _within(events[0].limits,
                                                             wire_vectors.LIMITS)
    monkeypatch.setattr(worker_endpoint, "negotiate", peers_limits)
    events = WorkerEndpoint(config()).receive_data(frame, 0.0)
    assert isinstance(events[0], SessionStarted)
    assert not _within(events[0].limits, wire_vectors.LIMITS)


def test_planted_verifier_that_skips_the_answer_limits_check_is_caught(monkeypatch):
    from pp1q.wire import verifier_endpoint

    answer = msgspec.msgpack.decode(control_of(V["hello_answer"]))
    answer[3] = list(msgspec.structs.astuple(_wider(wire_vectors.LIMITS)))  # limits: field 4
    frame = forge(MsgType.HELLO_ANSWER, msgspec.msgpack.encode(answer))
    v = VerifierEndpoint(config(), session=wire_vectors.SESSION)
    v.hello()
    with pytest.raises(RemoteProtocolError):  # the real check refuses a wider answer
        v.receive_data(frame, 0.0)
    monkeypatch.setattr(verifier_endpoint, "check_answer_limits", lambda *a: None)
    v = VerifierEndpoint(config(), session=wire_vectors.SESSION)
    v.hello()
    events = v.receive_data(frame, 0.0)
    assert isinstance(events[0], SessionStarted)
    assert not _within(events[0].limits, wire_vectors.LIMITS)


# -- the BufferedProtocol path ------------------------------------------------------------


def _buffered(endpoint, data: bytes, sizes: list[int], held: int | None = None) -> list:
    """``held``: the most bytes of an incomplete frame the decoder may hold after a read."""
    events, pos, k = [], 0, 0
    while pos < len(data):
        if held is not None:
            assert endpoint.decoder.buffered <= held
        buf = endpoint.get_buffer(-1)
        assert len(buf) > 0
        n = min(len(buf), len(data) - pos, sizes[k % len(sizes)])
        k += 1
        buf[:n] = data[pos:pos + n]
        pos += n
        events += endpoint.buffer_updated(n, 0.0)
    return events


def _summary(events) -> list:
    return [(type(e).__name__, getattr(e, "slot", None), getattr(e, "draft_ids", None),
             [(r.ids.tobytes(), r.counts.tobytes()) for r in getattr(e, "q_rows", ())])
            for e in events]


KINDS = ["dense", "sparse", "greedy", "proposal"]  # proposal: a sparse step answered whole


def _step(kind: str, depth: int):
    """A step of ``kind``; a proposal's top_k 2 fits one frame at every depth (1..5)."""
    return step(depth=depth, top_k={"sparse": 3, "proposal": 2}.get(kind, 0),
                temperature=0.0 if kind == "greedy" else 0.8)


def _answer(kind: str, w, stp, seed=0) -> bytes:
    """The worker's frames for ``stp``: its PROPOSAL, or REPLY 1..depth then COMPLETION."""
    return (worker_proposal if kind == "proposal" else worker_frames)(w, stp, seed)


@FUZZ
@given(st.sampled_from(KINDS), st.integers(1, 5),
       st.lists(st.integers(1, 300), min_size=1, max_size=8))
def test_buffered_path_equals_receive_data_at_any_chunking(kind, depth, sizes):
    stp = _step(kind, depth)
    results = []
    for how in ("receive_data", "buffered"):
        v, w = pair()
        w.receive_data(v.send(stp, now=0.0), 0.0)
        data = _answer(kind, w, stp, seed=depth)
        results.append(_summary(v.receive_data(data, 0.0) if how == "receive_data"
                                else _buffered(v, data, sizes)))
    assert results[0] == results[1]
    assert results[0][-1][0] == "ProposalReady" and len(results[0][-1][2]) == depth


@FUZZ
@given(st.sampled_from(["dense", "sparse", "proposal"]), st.data())
def test_buffered_path_with_mutated_traffic_raises_only_remote_errors(kind, data):
    stp = _step(kind, 3)
    v, w = pair()
    w.receive_data(v.send(stp, now=0.0), 0.0)
    buf = bytearray(_answer(kind, w, stp))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        buf = bytearray(harness.with_valid_checksums(bytes(buf)))  # reach the row checks
    sizes = data.draw(st.lists(st.integers(1, 200), min_size=1, max_size=6))
    for e in _events_or_remote_error(_buffered, v, bytes(buf), sizes) or ():
        if isinstance(e, ProposalReady):  # no sampled id without its q
            assert len(e.q_rows) == len(e.draft_ids) == stp.depth


@FUZZ
@given(st.sampled_from(PROPOSAL_SHAPES), st.data())
def test_proposals_with_any_control_fields_fail_alone_or_are_handed_out_whole(shape, data):
    """A PROPOSAL with any control fields (checksums valid), fed through the buffered
    path at any chunking: a stream error, a failed proposal, a discarded frame, or a
    proposal of exactly the step's depth, each row drawing its token; never more held
    than a header, the largest control part and the PROPOSAL cap, nothing once read."""
    depth, top_k = shape
    stp = step(depth=depth, top_k=top_k, seed=depth)
    v, _ = stepped(stp)
    base = encode(proposal_for(stp, seed=depth))
    control = data.draw(mutated_tree(control_of(base)))
    frame = forge(MsgType.PROPOSAL, control, base[HEADER_BYTES + len(control_of(base)):])
    sizes = data.draw(st.lists(st.integers(1, 200), min_size=1, max_size=6))
    lim = v.limits  # the PROPOSAL cap: its rows' bound, never more than a REPLY's
    held = HEADER_BYTES + MAX_CONTROL_BYTES + min(lim.max_depth * lim.sparse_row_bytes,
                                                  lim.max_payload)
    events = _events_or_remote_error(_buffered, v, frame, sizes, held)
    if events is None:
        return
    assert v.decoder.buffered == 0 and len(events) == 1
    [ev] = events
    assert isinstance(ev, ProposalFailed | ProposalReady | Discarded)
    if isinstance(ev, ProposalReady):
        assert len(ev.draft_ids) == len(ev.q_rows) == stp.depth
        assert all(row.count_of(t) > 0 for t, row in zip(ev.draft_ids, ev.q_rows, strict=True))


# -- CONTEXT frames -------------------------------------------------------------------------

CONTEXTS = {"open": encode(context_frame(1, generation=2, tokens=[3, 1, 4])),
            "append": encode(context_frame(1, generation=3, tokens=[5], start=len(PREFIX),
                                           digest=digest_of([*PREFIX, 5])))}


@FUZZ
@given(st.sampled_from(sorted(CONTEXTS)), st.data())
def test_context_frames_with_any_fields_are_refused_or_held_within_bounds(name, data):
    """A CONTEXT with any control fields (checksums valid): a stream error, a refusal,
    or a context whose ids are < vocab and whose length is within max_context; never
    another exception."""
    v, w = pair()
    base = CONTEXTS[name]
    control = data.draw(mutated_tree(control_of(base)))
    frame = forge(MsgType.CONTEXT, control, base[HEADER_BYTES + len(control_of(base)):])
    try:
        w.receive_data(frame, 0.0)
    except RemoteProtocolError:
        return
    for s in w.slots:
        if s.prefix is not None:
            assert len(s.prefix) <= w.limits.max_context
            assert all(0 <= t < w.vocab for t in s.prefix.tokens)


# -- the atheris harness ------------------------------------------------------------------


@FUZZ
@given(st.sampled_from(sorted(V)), st.data())
def test_harness_property_holds_for_mutated_vectors(name, data):
    buf = bytearray(V[name])
    for _ in range(data.draw(st.integers(0, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    harness.one_input(bytes(buf))  # raises anything but RemoteProtocolError: a bug


def test_checksum_fixup_keeps_valid_frames_and_repairs_mutated_ones():
    stream = b"".join(V[n] for n in sorted(V))
    assert harness.with_valid_checksums(stream) == stream
    frame = bytearray(V["step_dense"])
    frame[40] ^= 0x10  # inside the control part: the head checksum no longer matches
    try:
        FrameDecoder(wire_vectors.LIMITS).feed(bytes(frame))
        raise AssertionError("a corrupted control part passed the head checksum")
    except RemoteProtocolError as e:
        assert e.reason is Reason.CHECKSUM_MISMATCH
    fixed = harness.with_valid_checksums(bytes(frame))
    try:  # now the control part itself is judged
        FrameDecoder(wire_vectors.LIMITS).feed(fixed)
    except RemoteProtocolError as e:
        assert e.reason is not Reason.CHECKSUM_MISMATCH
