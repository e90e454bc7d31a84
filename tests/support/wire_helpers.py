"""Shared helpers for the wire tests: configs, endpoint pairs, chunked feeding."""

from __future__ import annotations

import msgspec
import numpy as np
from wire_vectors import IDENTITY, LIMITS, VOCAB

from pp1q.core.prefix import digest_of
from pp1q.core.q import build_row, sample
from pp1q.core.rng import proposal_u24
from pp1q.wire import (
    Form,
    Proposal,
    ProposalReady,
    Step,
    VerifierEndpoint,
    WireConfig,
    WorkerEndpoint,
    context_of,
    encode,
    proposal_from_rows,
    reply_from_row,
)
from pp1q.wire.framing import (
    FRAME_VERSION,
    HEADER,
    HEADER_BYTES,
    MAGIC,
    head_checksum,
    read_header,
)
from pp1q.wire.messages import PROPOSAL_HEAD_FIELDS, REPLY_HEAD_FIELDS, MsgType

SESSION = 77
PREFIX = list(range(10))  # the committed context pair() opens on every slot: last position 9


def config(versions=(1, 2), identity=IDENTITY, limits=LIMITS) -> WireConfig:
    return WireConfig(identity=identity, limits=limits, versions=versions)


def pair(versions=(1, 2), worker_versions=None, step_timeout=1.0, contexts=True,
         identity=IDENTITY, limits=LIMITS, verifier=VerifierEndpoint):
    """A verifier and a worker that completed HELLO, wired in memory; ``contexts``: every
    slot holds ``PREFIX`` (so ``step()``'s defaults pass the worker's context checks);
    ``verifier``: the verifier's endpoint class (a planted-bug subclass)."""
    v = verifier(config(versions, identity, limits), session=SESSION,
                 step_timeout=step_timeout)
    w = WorkerEndpoint(config(worker_versions or versions, identity, limits))
    w.receive_data(v.hello(), 0.0)
    v.receive_data(w.data_to_send(), 0.0)
    if contexts and v.limits is not None and w.state.value == "ready":
        for slot in range(v.limits.max_slots):
            w.receive_data(v.send(context_frame(slot)), 0.0)
    return v, w


def context_frame(slot=0, generation=0, tokens=PREFIX, start=0, digest=None):
    """A CONTEXT for ``slot`` (digest of ``tokens`` unless given: an append passes the
    digest of the whole prefix)."""
    return context_of(session=SESSION, slot=slot, generation=generation, tokens=tokens,
                      start=start, digest=digest_of(tokens) if digest is None else digest)


def step(slot=0, generation=1, round_id=1, last_committed=9, depth=3, temperature=0.8, top_k=0,
         **kw) -> Step:
    fields = dict(session=SESSION, slot=slot, generation=generation, round_id=round_id,
                  last_committed=last_committed, first_position=last_committed + 1,
                  prefix_digest=digest_of(PREFIX) if last_committed == 9 else 0, depth=depth,
                  temperature=temperature, top_k=top_k, context_version=0, seed=11)
    fields.update(kw)
    return Step(**fields)


def rows_for(st: Step, seed=0):
    """(token, row, form) per position, drawn as the worker leader would."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(st.depth):
        if st.temperature == 0:
            out.append((int(rng.integers(VOCAB)), None, Form.TOKEN_ONLY))
            continue
        row = build_row(rng.normal(size=VOCAB), temperature=st.temperature,
                        top_k=st.top_k or None)
        u = proposal_u24(st.seed, st.generation, st.round_id, st.first_position + i)
        out.append((sample(row, u), row, Form.SPARSE if st.top_k else Form.DENSE))
    return out


def replies_for(st: Step, seed=0):
    return [
        reply_from_row(session=st.session, slot=st.slot, generation=st.generation,
                       round_id=st.round_id, index=i + 1, position=st.first_position + i,
                       token=tok, row=row, form=form, dense_len=LIMITS.dense_len)
        for i, (tok, row, form) in enumerate(rows_for(st, seed))
    ]


def worker_frames(w: WorkerEndpoint, st: Step, seed=0) -> bytes:
    """Everything the worker sends for one step: REPLY 1..depth then COMPLETION."""
    data = b"".join(w.send(r) for r in replies_for(st, seed))
    return data + w.send(w.completion(st.slot))


def stepped(st: Step, check_outgoing: bool = True, verifier=VerifierEndpoint):
    """``pair()`` whose worker holds ``st`` (the verifier sent it at time 0)."""
    v, w = pair(verifier=verifier)
    w.check_outgoing = check_outgoing
    w.receive_data(v.send(st, now=0.0), 0.0)
    return v, w


def drafted(st: Step, seed=0) -> tuple[list, list]:
    """``rows_for``'s (tokens, rows), as ``send_proposal`` takes them."""
    out = rows_for(st, seed)
    return [t for t, _, _ in out], [r for _, r, _ in out]


def proposal_for(st: Step, seed=0) -> Proposal:
    """The PROPOSAL answering the sparse ``st`` whole (``rows_for``'s rows)."""
    tokens, rows = drafted(st, seed)
    return proposal_from_rows(session=st.session, slot=st.slot, generation=st.generation,
                              round_id=st.round_id, first_position=st.first_position,
                              context_version=st.context_version, tokens=tokens, rows=rows)


# (depth, top_k) of sparse steps one PROPOSAL answers under LIMITS (payload cap 80 bytes):
# one row of one entry, three rows of three, five rows of two (the cap exactly)
PROPOSAL_SHAPES = ((1, 1), (3, 3), (5, 2))


def proposal_frames() -> list[bytes]:
    """Honest PROPOSAL frames, one per shape (for step(depth=d, top_k=k, seed=d))."""
    return [encode(proposal_for(step(depth=d, top_k=k, seed=d), seed=d))
            for d, k in PROPOSAL_SHAPES]


def worker_proposal(w: WorkerEndpoint, st: Step, seed=0) -> bytes:
    """The worker's one frame for the sparse ``st``: its PROPOSAL (``send_proposal``)."""
    return w.send_proposal(st, *drafted(st, seed))


def forge_proposal(prop: Proposal, payload: bytes | None = None, **head) -> bytes:
    """``prop``'s frame with control fields replaced (``head``: field -> value) and its
    payload replaced, every frame checksum valid (a row checksum is what ``head`` says)."""
    fields = dict(zip(Proposal.__struct_fields__[:PROPOSAL_HEAD_FIELDS],
                      msgspec.structs.astuple(prop), strict=False))
    fields.update(head)
    if payload is None:
        payload = b"".join(bytes(p) for p in prop.payload_parts())
    return forge(MsgType.PROPOSAL, msgspec.msgpack.encode(list(fields.values())), payload)


def assert_ready(ready, st, tokens, rows) -> None:
    """``ready`` hands out exactly ``tokens`` and ``rows`` for ``st``, each position as
    the REPLY that would have carried it."""
    assert isinstance(ready, ProposalReady) and not ready.greedy
    assert (ready.slot, ready.generation, ready.round_id, ready.first_position) == (
        st.slot, st.generation, st.round_id, st.first_position)
    assert ready.draft_ids == tuple(tokens) and all(type(t) is int for t in ready.draft_ids)
    assert len(ready.q_rows) == len(rows) and all(
        a == b for a, b in zip(ready.q_rows, rows, strict=True))
    for i, (r, token, row) in enumerate(zip(ready.replies, tokens, rows, strict=True), 1):
        ids, q = row.to_sparse()
        assert msgspec.structs.astuple(r)[:REPLY_HEAD_FIELDS] == (
            SESSION, st.slot, st.generation, st.round_id, i, st.first_position + i - 1,
            token, Form.SPARSE, ids.size)
        assert r.ids.tobytes() == ids.astype("<i4").tobytes()
        assert r.q.tobytes() == q.astype("<f4").tobytes()
        assert not (r.ids.flags.writeable or r.q.flags.writeable)  # views of the frame


def splits(data: bytes, rng: np.random.Generator):
    """``data`` cut at random points (some empty chunks included)."""
    cuts = np.sort(rng.integers(0, len(data) + 1, size=rng.integers(0, 12)))
    edges = [0, *cuts.tolist(), len(data)]
    return [data[a:b] for a, b in zip(edges[:-1], edges[1:], strict=True)]


def feed_buffered(protocol, data: bytes, now: float | None = None, read: int | None = None
                  ) -> list:
    """``data`` into an asyncio BufferedProtocol as the loop does: recv_into its
    get_buffer(), then buffer_updated(n), as many times as the buffers take. ``now``: a
    sans-IO endpoint's hooks take the clock (their events are returned, joined);
    ``read``: at most this many bytes a read (a payload then lands in its own buffer)."""
    events = []
    while data:
        buf = protocol.get_buffer(len(data))
        n = min(len(buf), len(data), read or len(data))
        buf[:n] = data[:n]
        events += (protocol.buffer_updated(n) if now is None
                   else protocol.buffer_updated(n, now)) or ()
        data = data[n:]
    return events


class HoldingTransport:
    """An asyncio transport stand-in for the worker adapter: keeps every buffer it is
    given, unread until ``take()``; ``drains``: reports an empty buffer (and copies, as a
    kernel does) instead of holding references."""

    def __init__(self, drains: bool = True) -> None:
        self.drains, self.held, self.writes = drains, [], []

    def writelines(self, parts) -> None:
        parts = [bytes(p) if self.drains else p for p in parts]
        self.writes.append(b"".join(bytes(p) for p in parts))  # each call's bytes, in order
        self.held += parts

    def write(self, data) -> None:
        self.writelines((data,))

    def get_write_buffer_size(self) -> int:
        return 0 if self.drains else sum(len(p) for p in self.held)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def take(self) -> bytes:
        out, self.held = b"".join(bytes(p) for p in self.held), []
        return out


def feed_all(decoder, chunks) -> list:
    out = []
    for c in chunks:
        out += decoder.feed(c)
    return out


def forge(mtype: int, control: bytes, payload: bytes = b"", *, magic=MAGIC,
          version=FRAME_VERSION, flags=0, control_len=None, payload_len=None,
          payload_sum=None) -> bytes:
    """A frame with arbitrary fields but correct checksums (unless overridden)."""
    import xxhash

    fields = [magic, version, mtype, flags,
              len(control) if control_len is None else control_len,
              len(payload) if payload_len is None else payload_len,
              xxhash.xxh3_64_intdigest(payload) if payload_sum is None else payload_sum, 0]
    fields[-1] = head_checksum(HEADER.pack(*fields), control)
    return HEADER.pack(*fields) + control + payload


def control_of(frame: bytes) -> bytes:
    n = read_header(frame).control_len
    return frame[HEADER_BYTES:HEADER_BYTES + n]


def payload_of(frame: bytes) -> bytes:
    n = read_header(frame).control_len
    return frame[HEADER_BYTES + n:]
