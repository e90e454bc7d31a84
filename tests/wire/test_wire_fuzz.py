"""Property tests: malformed input raises RemoteProtocolError and nothing else, and a
state machine drives both endpoints through their tables with clean traffic."""


import msgspec
import numpy as np
import pytest
import wire_vectors
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from wire_helpers import (
    PREFIX,
    PROPOSAL_SHAPES,
    SESSION,
    context_frame,
    control_of,
    forge,
    forge_proposal,
    pair,
    payload_of,
    proposal_for,
    proposal_frames,
    replies_for,
    step,
    stepped,
)

from pp1q.core.prefix import digest_of
from pp1q.wire import (
    Commit,
    Discarded,
    FrameDecoder,
    Proposal,
    ProposalFailed,
    ProposalReady,
    Reason,
    RemoteProtocolError,
    Reset,
    SlotState,
    encode,
)
from pp1q.wire.framing import HEADER, HEADER_BYTES
from pp1q.wire.messages import MsgType
from pp1q.wire.proposal import row_checksum
from pp1q.wire.sizes import proposal_fits

pytestmark = pytest.mark.experiment  # many-case fuzzing in process

V = wire_vectors.load()
FRAMES = [V[n] for n in sorted(V)] + proposal_frames()  # revision 3's PROPOSAL too
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def decode_only_remote_errors(data: bytes, cuts=()):
    d = FrameDecoder(wire_vectors.LIMITS)
    edges = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    try:
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            d.feed(data[a:b])
    except RemoteProtocolError as e:
        assert isinstance(e.reason, Reason)


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes(data):
    decode_only_remote_errors(data)


@FUZZ
@given(st.binary(max_size=200), st.sampled_from(FRAMES))
def test_random_bytes_after_a_valid_header_start(tail, frame):
    decode_only_remote_errors(frame[:8] + tail)


@FUZZ
@given(st.sampled_from(FRAMES), st.data())
def test_mutated_frames(frame, data):
    buf = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        i = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if kind == "flip" and buf:
            buf[i] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set" and buf:
            buf[i] = data.draw(st.integers(0, 255))
        elif kind == "insert":
            buf[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del buf[i:i + data.draw(st.integers(1, 8))]
        else:
            del buf[i:]
    cuts = data.draw(st.lists(st.integers(0, 1 << 16), max_size=6))
    decode_only_remote_errors(bytes(buf) + frame, cuts)


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=14) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=4),
    max_leaves=30,
)


@FUZZ
@given(st.sampled_from(list(MsgType)), msgpack_values, st.binary(max_size=96))
def test_well_checksummed_frames_with_arbitrary_control(mtype, control, payload):
    # valid checksums everywhere: only the schema and the size checks stand in the way
    frame = forge(mtype, msgspec.msgpack.encode(control), payload)
    decode_only_remote_errors(frame)


@FUZZ
@given(st.sampled_from([n for n in sorted(V) if n.startswith("reply_")]), st.data())
def test_well_checksummed_mutated_rows_reach_the_endpoint_safely(name, data):
    # the row reaches the row validators: events or RemoteProtocolError, nothing else
    frame = V[name]
    head = list(msgspec.structs.astuple(wire_vectors.messages()[name]))[:9]
    head[8] = data.draw(st.integers(0, 6)) if data.draw(st.booleans()) else head[8]
    head[6] = data.draw(st.integers(-2, 20)) if data.draw(st.booleans()) else head[6]
    payload = bytearray(payload_of(frame))
    for _ in range(data.draw(st.integers(0, 6))):
        if payload:
            payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    head[:4] = [SESSION, 0, 1, 1]
    head[5] = 10
    v, _ = pair()
    top_k = {"reply_sparse": 3, "reply_dense": 0}.get(name, 0)
    v.send(step(depth=2, top_k=top_k, temperature=0.0 if name.endswith("only") else 0.8),
           now=0.0)
    try:
        evs = v.receive_data(forge(MsgType.REPLY, msgspec.msgpack.encode(head),
                                   bytes(payload)), 0.0)
    except RemoteProtocolError:
        return
    assert all(isinstance(e, ProposalFailed) for e in evs)
    assert control_of(frame)  # the vector itself stays intact


def _rows_of(payload: bytes, entries) -> list[tuple[bytes, bytes]]:
    """(ids bytes, q bytes) of each row of a PROPOSAL payload laid out by ``entries``."""
    rows, at = [], 0
    for n in entries:
        rows.append((payload[at:at + 4 * n], payload[at + 4 * n:at + 8 * n]))
        at += 8 * n
    return rows


@FUZZ
@given(st.sampled_from(PROPOSAL_SHAPES), st.data())
def test_well_checksummed_mutated_proposals_reach_the_endpoint_safely(shape, data):
    """A PROPOSAL with its lists and row bytes mutated, frame checksums valid and (when
    the sizes still agree) row checksums recomputed, so that mutations reach the row
    checks; fed whole or split: a RemoteProtocolError, a failed proposal, or one handed
    out with exactly the rows on the wire, each able to draw its token."""
    depth, top_k = shape
    stp = step(depth=depth, top_k=top_k, seed=depth)
    prop = proposal_for(stp, seed=depth)
    head = {}
    for name, values in (("tokens", st.integers(-2, 20)), ("entries", st.integers(0, 6)),
                         ("row_checksums", st.integers(0, (1 << 64) - 1))):
        roll = data.draw(st.integers(0, 7))  # mostly kept or one position changed: the
        new = list(getattr(prop, name))  # sizes then agree and the rows are checked
        if roll == 7:  # lists of another length
            new = data.draw(st.lists(values, max_size=7))
        elif roll >= 5:
            new[data.draw(st.integers(0, depth - 1))] = data.draw(values)
        head[name] = new
    payload = bytearray(payload_of(encode(prop)))
    for _ in range(data.draw(st.integers(0, 4))):
        i = data.draw(st.integers(0, len(payload)))
        how = data.draw(st.sampled_from(["set"] * 6 + ["cut", "grow"]))
        if how == "set" and i < len(payload):
            payload[i] = data.draw(st.integers(0, 255))
        elif how == "cut":
            del payload[i:i + data.draw(st.sampled_from([1, 4, 8]))]
        elif how == "grow":
            payload[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    entries = head["entries"]
    if head["row_checksums"] == prop.row_checksums and len(payload) == 8 * sum(entries):
        head["row_checksums"] = [row_checksum(a, b) for a, b in _rows_of(payload, entries)]
    frame = forge_proposal(prop, bytes(payload), **head)
    v, _ = stepped(stp)
    edges = [0, *sorted(data.draw(st.lists(st.integers(0, len(frame)), max_size=4))),
             len(frame)]
    events = []
    try:
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            events += v.receive_data(frame[a:b], 0.0)
    except RemoteProtocolError as e:
        assert isinstance(e.reason, Reason)
        event(f"raised {e.reason.value}")  # --hypothesis-show-statistics
        return
    assert len(events) == 1 and v.decoder.buffered == 0
    [ev] = events
    if isinstance(ev, ProposalFailed):
        assert v.failures[ev.reason] == 1
        event(f"failed {ev.reason.value}")
        return
    event("handed out")
    assert isinstance(ev, ProposalReady) and len(ev.draft_ids) == len(ev.q_rows) == depth
    assert list(ev.draft_ids) == head["tokens"]
    sent = _rows_of(bytes(payload), entries)
    for r, row, (ids, q), declared in zip(ev.replies, ev.q_rows, sent, head["row_checksums"],
                                          strict=True):
        assert (r.ids.tobytes(), r.q.tobytes()) == (ids, q) and row.count_of(r.token) > 0
        assert row_checksum(ids, q) == declared


# -- both endpoints under a state machine -----------------------------------------------

class Pair(RuleBasedStateMachine):
    """Clean traffic with arbitrary interleaving, chunking, resets and timeouts."""

    def __init__(self):
        super().__init__()
        self.v, self.w = pair(step_timeout=5.0)
        self.now = 0.0
        self.to_w, self.to_v = b"", b""
        n = len(self.v.slots)
        self.gen, self.round, self.last_committed = [1] * n, [0] * n, [9] * n
        self.pending = {}  # slot -> replies the worker has yet to send
        self.ready = {}  # (slot, gen, round) -> tokens the worker sent
        self.sent_tokens = {}
        self.dead = set()  # (slot, gen) reset by the verifier
        self.prefix = [list(PREFIX) for _ in range(n)]  # the committed context, our view
        self.held = [True] * n  # whether the worker still holds it (pair() opened them)

    def _events(self, evs):
        for e in evs:
            if isinstance(e, ProposalReady):
                key = (e.slot, e.generation, e.round_id)
                assert key not in self.ready, "a proposal handed out twice"
                assert (e.slot, e.generation) not in self.dead
                assert e.draft_ids == self.sent_tokens[key]
                assert len(e.q_rows) == (0 if e.greedy else len(e.draft_ids))
                self.ready[key] = e.draft_ids
            elif isinstance(e, Discarded):
                assert e.reason == Reason.STALE_GENERATION
                assert (e.slot, e.generation) in self.dead or \
                    self.v.slots[e.slot].is_dead(e.generation)
            elif isinstance(e, ProposalFailed):
                assert e.reason == Reason.STEP_TIMEOUT

    def _new_generation(self, slot):
        self.gen[slot] += 1
        self.round[slot] = 0

    def _idle(self):
        return [i for i, s in enumerate(self.v.slots) if s.state is SlotState.IDLE]

    def _sendable(self):
        out = []
        for slot, (stp, _) in self.pending.items():
            ws = self.w.slots[slot]
            if (ws.generation, ws.round_id) == (stp.generation, stp.round_id) \
                    or ws.is_dead(stp.generation):  # the STEP (or its RESET) arrived
                out.append(slot)
        return out

    def _in_state(self, *states):
        return [i for i, s in enumerate(self.v.slots) if s.state in states]

    @precondition(lambda self: self._idle() and self.v.inflight < self.v.limits.max_inflight)
    @rule(data=st.data(), depth=st.integers(1, 5),
          kind=st.sampled_from(["dense", "sparse", "greedy"]), whole=st.booleans())
    def send_step(self, data, depth, kind, whole):
        """``whole``: a sparse step that fits one frame is answered by its PROPOSAL (the
        verifier takes either answer for it)."""
        slot = data.draw(st.sampled_from(self._idle()))
        if len(self.prefix[slot]) + depth + 1 > self.v.limits.max_context:
            self._new_generation(slot)  # a new request on the slot: a short prompt again
            self.prefix[slot], self.last_committed[slot] = list(PREFIX), 9
            self.held[slot] = False
        if not self.held[slot]:  # the request ended (RESET cancelled): open it again
            self.to_w += self.v.send(context_frame(slot, self.gen[slot], self.prefix[slot]))
            self.held[slot] = True
        self.round[slot] += 1
        stp = step(slot=slot, generation=self.gen[slot], round_id=self.round[slot],
                   last_committed=self.last_committed[slot], depth=depth,
                   prefix_digest=digest_of(self.prefix[slot]),
                   top_k=3 if kind == "sparse" else 0,
                   temperature=0.0 if kind == "greedy" else 0.9)
        self.to_w += self.v.send(stp, now=self.now)
        if whole and proposal_fits(stp, self.v.limits):
            reps = [proposal_for(stp, seed=self.round[slot])]
            tokens = tuple(reps[0].tokens)
        else:
            reps = replies_for(stp, seed=self.round[slot])
            tokens = tuple(r.token for r in reps)
        self.sent_tokens[(slot, stp.generation, stp.round_id)] = tokens
        self.pending[slot] = (stp, reps)

    @precondition(lambda self: self._sendable())
    @rule(data=st.data(), count=st.integers(1, 6))
    def worker_sends(self, data, count):
        slot = data.draw(st.sampled_from(self._sendable()))
        stp, reps = self.pending[slot]
        for _ in range(count):
            if not self.w.is_live(slot, stp.generation, stp.round_id):
                del self.pending[slot]  # reset under us: stop, as the daemon would
                return
            if reps:
                msg = reps.pop(0)
                self.to_v += self.w.send(msg)
                if isinstance(msg, Proposal):  # answered whole: no COMPLETION follows
                    event("a step answered by its PROPOSAL")
                    del self.pending[slot]
                    return
            else:
                self.to_v += self.w.send(self.w.completion(slot))
                del self.pending[slot]
                return

    @precondition(lambda self: self.to_w)
    @rule(cut=st.one_of(st.just(None), st.integers(1, 200)))
    def deliver_to_worker(self, cut):
        """Deliver everything queued (cut None) or its first ``cut`` bytes."""
        k = len(self.to_w) if cut is None else cut
        data, self.to_w = self.to_w[:k], self.to_w[k:]
        self._events(self.w.receive_data(data, self.now))
        self.to_v += self.w.data_to_send()

    @precondition(lambda self: self.to_v)
    @rule(cut=st.one_of(st.just(None), st.integers(1, 200)))
    def deliver_to_verifier(self, cut):
        k = len(self.to_v) if cut is None else cut
        data, self.to_v = self.to_v[:k], self.to_v[k:]
        self._events(self.v.receive_data(data, self.now))

    @precondition(lambda self: self._in_state(SlotState.READY))
    @rule(data=st.data(), accepted=st.integers(0, 5), token=st.integers(0, 15))
    def commit(self, data, accepted, token):
        slot = data.draw(st.sampled_from(self._in_state(SlotState.READY)))
        s = self.v.slots[slot]
        accepted = min(accepted, s.step.depth)
        committed = s.step.last_committed + accepted + 1
        self.to_w += self.v.send(Commit(session=SESSION, slot=slot, generation=s.generation,
                                        round_id=s.round_id, accepted=accepted, token=token,
                                        committed=committed))
        self.last_committed[slot] = committed
        drafts = self.ready[(slot, s.generation, s.round_id)]
        self.prefix[slot] += [*drafts[:accepted], token]  # the worker appends the same

    @precondition(lambda self: self._idle())
    @rule(data=st.data(), token=st.integers(0, 15))
    def append_context(self, data, token):
        """A fallback's target-only token: appended, never the prefix again."""
        slot = data.draw(st.sampled_from(self._idle()))
        if not self.held[slot] or len(self.prefix[slot]) >= self.v.limits.max_context - 6:
            return
        self._new_generation(slot)  # as the scheduler does after a fallback
        whole = [*self.prefix[slot], token]
        self.to_w += self.v.send(context_frame(slot, self.gen[slot], [token],
                                               start=len(self.prefix[slot]),
                                               digest=digest_of(whole)))
        self.prefix[slot] = whole
        self.last_committed[slot] += 1

    @precondition(lambda self: self._in_state(SlotState.STEPPING, SlotState.READY,
                                              SlotState.FAILED))
    @rule(data=st.data(), reason=st.sampled_from([Reason.CANCELLED, Reason.STEP_TIMEOUT]))
    def reset(self, data, reason):
        """CANCELLED ends the request (the worker drops its context); any other reason
        discards the proposal only (the worker keeps the committed prefix)."""
        busy = self._in_state(SlotState.STEPPING, SlotState.READY, SlotState.FAILED)
        slot = data.draw(st.sampled_from(busy))
        self.to_w += self.v.send(Reset(session=SESSION, slot=slot, generation=self.gen[slot],
                                       reason=reason))
        self.held[slot] = self.held[slot] and reason is not Reason.CANCELLED
        self.dead.add((slot, self.gen[slot]))
        self.gen[slot] += 1
        self.round[slot] = 0

    @rule(dt=st.sampled_from([0.01, 0.1, 1.0, 6.0]))
    def tick(self, dt):
        self.now += dt
        self._events(self.v.check_timeouts(self.now))

    @invariant()
    def failed_slots_have_dead_generations(self):
        for s in self.v.slots:
            if s.state is SlotState.FAILED:
                assert s.is_dead(s.generation)

    @invariant()
    def worker_never_ahead_of_the_verifier(self):
        for sv, sw in zip(self.v.slots, self.w.slots, strict=True):
            assert sw.generation <= sv.generation and sw.dead_upto <= sv.dead_upto

    @invariant()
    def clean_traffic_fails_only_by_timeout(self):
        assert set(self.v.failures) <= {Reason.STEP_TIMEOUT}
        assert set(self.v.discarded) <= {Reason.STALE_GENERATION}


Pair.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])
TestPair = Pair.TestCase


def test_header_struct_is_32_bytes():
    assert HEADER.size == HEADER_BYTES == 32 and len(FRAMES[0]) > HEADER_BYTES  # docs/wire.md
    assert np.frombuffer(V["reply_dense"][-80:], "<f4").sum() == 1.0


def _atheris_harness():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "fuzz" / "wire_atheris.py"
    spec = importlib.util.spec_from_file_location("wire_atheris", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_atheris_harness_runs_without_libfuzzer():
    # keeps fuzz/wire_atheris.py from rotting: its property over vectors and noise
    mod = _atheris_harness()
    rng = np.random.default_rng(5)
    for frame in FRAMES:
        mod.one_input(frame)
        mod.one_input(bytes(rng.integers(0, 256, 64, dtype=np.uint8)) + frame)


def test_atheris_harness_steps_meet_the_golden_proposal_and_dense_reply():
    """Its seeds get past the state checks: the golden PROPOSAL and the dense REPLY (each
    for the vectors' slot 2) each meet a step of their form in one of the harness's
    verifiers, so a libFuzzer run mutates from frames that reach the row checks."""
    mod = _atheris_harness()
    dense_at_2, sparse_at_2 = (mod._stepping_verifier(s) for s in mod._STEP_SETS)
    [ready] = sparse_at_2.receive_data(V["proposal"], 0.0)
    assert isinstance(ready, ProposalReady) and ready.slot == 2
    assert dense_at_2.receive_data(V["reply_dense"], 0.0) == []  # row 1 accepted
    assert len(dense_at_2.slots[2].rows) == 1


@FUZZ
@given(st.sampled_from([MsgType.STEP, MsgType.COMMIT, MsgType.RESET, MsgType.REFUSAL]),
       st.lists(st.integers(-1, 1 << 33) | st.floats() | st.sampled_from(["cancelled", ""]),
                min_size=4, max_size=13))
def test_worker_endpoint_takes_arbitrary_well_formed_frames_safely(mtype, fields):
    fields[0] = SESSION if isinstance(fields[0], int) else fields[0]
    _, w = pair()
    try:
        w.receive_data(forge(mtype, msgspec.msgpack.encode(fields)), 0.0)
    except RemoteProtocolError as e:
        assert isinstance(e.reason, Reason)
