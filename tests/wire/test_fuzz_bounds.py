"""Bounds before memory: a declared length beyond the negotiated size is refused from
the header alone, before anything is allocated for it, on every path a peer's bytes take
(frame decoder, both endpoints, the BufferedProtocol hooks, REPLY, PROPOSAL and CONTEXT
frames, and live daemons; the HTTP head's: tests/verifier/test_http_api.py). tracemalloc
bounds what each refusal allocated, in a forked child as its only thread (it counts every
thread's allocations: tests/support/forked.py)."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest
import wire_vectors
from daemon_harness import scrape, value
from forked import assert_alone, forked
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_helpers import config, control_of, forge, pair, proposal_frames, step

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.models.toy import ToySpec
from pp1q.runtime.settings import VerifierSettings, WorkerSettings
from pp1q.verifier.daemon import build as build_verifier
from pp1q.wire import FrameDecoder, VerifierEndpoint, WorkerEndpoint
from pp1q.wire.framing import HEADER_BYTES, read_header
from pp1q.wire.limits import MAX_CONTROL_BYTES
from pp1q.wire.messages import MsgType
from pp1q.wire.session_config import verifier_config, worker_config
from pp1q.wire.sizes import payload_cap
from pp1q.worker.daemon import serve

V = wire_vectors.build()
LIM = wire_vectors.LIMITS
DECLARED = [1 << 31, (1 << 32) - 1]  # the 2^31, and the largest a u32 can say
ALLOCATED_MAX = 64 * 1024  # bytes a refusal may allocate (messages, tracebacks), not 2 GiB
TIMEOUT_S = 10.0


# each frame type's payload cap, as docs/wire.md states it: a REPLY's the largest row; a
# PROPOSAL's its rows' bound, never more than a REPLY's (no new memory granted); a
# CONTEXT's every context token
CAPS = {MsgType.REPLY: LIM.max_payload,
        MsgType.PROPOSAL: min(LIM.max_depth * LIM.sparse_row_bytes, LIM.max_payload),
        MsgType.CONTEXT: LIM.max_context_bytes}
CONTROLS = {MsgType.REPLY: control_of(V["reply_dense"]), MsgType.CONTEXT: control_of(V["context"]),
            MsgType.PROPOSAL: control_of(proposal_frames()[-1])}


def _header(field: str, n: int, mtype: MsgType = MsgType.REPLY) -> bytes:
    control = CONTROLS.get(mtype, control_of(V["step_dense"]))
    kw = {"payload_len": n} if field == "payload_len" else {"control_len": n}
    return forge(mtype, control, **kw)[:HEADER_BYTES]  # the header only: nothing else ever arrives


def _buffered(endpoint, data: bytes) -> None:
    pos = 0
    while pos < len(data):
        buf = endpoint.get_buffer(-1)
        assert len(buf) <= 64 * 1024  # never a buffer sized by a declared length
        n = min(len(buf), len(data) - pos)
        buf[:n] = data[pos:pos + n]
        pos += n
        endpoint.buffer_updated(n, 0.0)


def _stepping_verifier() -> VerifierEndpoint:
    v, _w = pair()
    v.send(step(depth=3, top_k=0), now=0.0)
    return v


def _ready_worker() -> WorkerEndpoint:
    v = VerifierEndpoint(config(), session=5)
    w = WorkerEndpoint(config())
    w.receive_data(v.hello(), 0.0)
    return w


PATHS = {  # name -> (make the receiver, feed it)
    "decoder.feed": (lambda: FrameDecoder(LIM), lambda r, d: r.feed(d)),
    "decoder.buffered": (lambda: FrameDecoder(LIM),
                         lambda r, d: _buffered(_Adapter(r), d)),
    "verifier.receive_data": (_stepping_verifier, lambda r, d: r.receive_data(d, 0.0)),
    "verifier.buffered": (_stepping_verifier, _buffered),
    "worker.receive_data": (_ready_worker, lambda r, d: r.receive_data(d, 0.0)),
    "worker.buffered": (_ready_worker, _buffered),
}


class _Adapter:
    """FrameDecoder's hooks under the endpoints' (buffer_updated(n, now)) signature."""

    def __init__(self, decoder: FrameDecoder) -> None:
        self.d = decoder

    def get_buffer(self, hint):
        return self.d.get_buffer(hint)

    def buffer_updated(self, n, _now):
        return self.d.buffer_updated(n)


def _refused_without_allocating(receive, data: bytes) -> RemoteProtocolError:
    assert_alone()
    tracemalloc.start()
    try:
        with pytest.raises(RemoteProtocolError) as e:
            receive(data)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOCATED_MAX, f"{peak} bytes allocated while refusing"
    return e.value


# the frames with a payload each receiver takes: a worker never receives REPLY or PROPOSAL
# (refused by type at the header: test_wire_hostile, test_wire_proposal), so its declared
# lengths are tested on the large frame it does receive, CONTEXT
RECEIVED = {"decoder": (MsgType.REPLY, MsgType.PROPOSAL, MsgType.CONTEXT),
            "verifier": (MsgType.REPLY, MsgType.PROPOSAL), "worker": (MsgType.CONTEXT,)}
PATH_TYPES = [(path, t) for path in sorted(PATHS) for t in RECEIVED[path.split(".")[0]]]


@pytest.mark.parametrize("n", DECLARED)
@pytest.mark.parametrize("field", ["payload_len", "control_len"])
@pytest.mark.parametrize("path,mtype", PATH_TYPES, ids=[f"{p}-{t.name}" for p, t in PATH_TYPES])
@forked
def test_declared_length_refused_from_the_header_before_allocation(path, mtype, field, n):
    make, feed = PATHS[path]
    receiver = make()
    e = _refused_without_allocating(lambda d: feed(receiver, d), _header(field, n, mtype))
    assert e.reason is Reason.FRAME_TOO_LARGE and str(n) in e.detail


class _BuffersFirst(FrameDecoder):
    """Planted: takes a buffer for the declared payload (up to 1 MiB here, not the 2 GiB a
    real bug would) before the header's checks run: allocate-before-check."""

    def _check_header(self, buf, at: int):
        self.held = self.pool.take(min(read_header(buf, at).payload_len, 1 << 20))
        return super()._check_header(buf, at)


@forked
def test_planted_allocate_before_check_is_caught():
    # the measure above, shown to fail: the same refusal, with a payload buffer taken first
    data = _header("payload_len", 1 << 31)
    e = _refused_without_allocating(FrameDecoder(LIM).feed, data)
    assert e.reason is Reason.FRAME_TOO_LARGE
    with pytest.raises(AssertionError, match="allocated while refusing"):
        _refused_without_allocating(_BuffersFirst(LIM).feed, data)


@pytest.mark.parametrize("mtype", [MsgType.REPLY, MsgType.PROPOSAL])
@forked
def test_one_byte_over_the_negotiated_row_is_refused_too(mtype):
    # the cap is the negotiated row size (a PROPOSAL's: its rows' bound, never more than a
    # row's), not some large constant
    cap = CAPS[mtype]
    assert payload_cap(mtype, LIM) == cap
    assert FrameDecoder(LIM).feed(_header("payload_len", cap, mtype)) == []  # that large is legal
    e = _refused_without_allocating(FrameDecoder(LIM).feed, _header("payload_len", cap + 1, mtype))
    assert e.reason is Reason.FRAME_TOO_LARGE
    e = _refused_without_allocating(FrameDecoder(LIM).feed,
                                    _header("control_len", MAX_CONTROL_BYTES + 1))
    assert e.reason is Reason.FRAME_TOO_LARGE


NEAR = [0, 1, 79, 80, 81, 256, 257, 4095, 4096, 4097, (1 << 31) - 1, 1 << 31, (1 << 32) - 1]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([MsgType.REPLY, MsgType.PROPOSAL, MsgType.CONTEXT]),
       st.sampled_from(NEAR) | st.integers(0, (1 << 32) - 1),
       st.sampled_from(NEAR) | st.integers(0, (1 << 32) - 1), st.integers(1, HEADER_BYTES))
def test_any_declared_lengths_are_judged_at_the_header_alone(mtype, control_len, payload_len,
                                                              read):
    """Any declared lengths, the header fed in reads of ``read`` bytes: refused at the
    header exactly when past a cap (nothing held but the header), else awaited with
    nothing but the header held."""
    d = FrameDecoder(LIM)
    header = forge(mtype, CONTROLS[mtype], control_len=control_len,
                   payload_len=payload_len)[:HEADER_BYTES]
    try:
        for at in range(0, HEADER_BYTES, read):
            assert d.feed(header[at:at + read]) == []
    except RemoteProtocolError as e:
        if control_len == 0:
            assert e.reason is Reason.MALFORMED_CONTROL
        else:
            assert e.reason is Reason.FRAME_TOO_LARGE
            assert control_len > MAX_CONTROL_BYTES or payload_len > CAPS[mtype]
    else:
        assert 0 < control_len <= MAX_CONTROL_BYTES and payload_len <= CAPS[mtype]
    assert d.buffered <= HEADER_BYTES


@pytest.mark.parametrize("n", [*DECLARED, LIM.max_context_bytes + 1])
@forked
def test_a_context_frame_declaring_more_than_max_context_is_refused_from_its_header(n):
    header = forge(MsgType.CONTEXT, control_of(V["context"]), payload_len=n)[:HEADER_BYTES]
    e = _refused_without_allocating(FrameDecoder(LIM).feed, header)
    assert e.reason is Reason.FRAME_TOO_LARGE


# -- live daemons, in-process -------------------------------------------------------------


def _settings(cls, **over):
    return cls(**{"vocab": 16, "metrics_port": 0, "speculation": "sampled", **over})


async def _traced(coro):
    """Run ``coro``; the peak bytes allocated meanwhile (the whole process)."""
    tracemalloc.start()
    try:
        await coro
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def test_live_worker_refuses_2_pow_31_after_the_header_and_counts_it():
    stop, ports = asyncio.Event(), []
    task = asyncio.create_task(serve(_settings(WorkerSettings, listen="127.0.0.1:0"), stop,
                                     ready=lambda p, m: ports.append((p, m))))
    while not ports:
        await asyncio.sleep(0.01)
    port, mport = ports[0]
    v = VerifierEndpoint(verifier_config(ToySpec(vocab=16), (2,), 4, 5, 8), session=3)

    async def exchange():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(v.hello())
        v.receive_data(await asyncio.wait_for(reader.read(65536), TIMEOUT_S), 0.0)
        writer.write(_header("payload_len", 1 << 31, MsgType.STEP))
        assert await asyncio.wait_for(reader.read(65536), TIMEOUT_S) == b""  # closed on us
        writer.close()

    try:
        peak = await _traced(exchange())
        assert peak < 16 << 20  # far below 2 GiB: nothing was sized by the declared length
        assert value(scrape(mport), "pp1q_validation_failures_total",
                     reason="frame_too_large") == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT_S)


async def test_live_verifier_refuses_a_2_pow_31_reply_after_the_header_and_counts_it():
    """A worker that answers HELLO, then sends a REPLY header declaring 2^31 bytes."""
    closed = asyncio.Event()

    async def rogue_worker(reader, writer):
        try:
            w = WorkerEndpoint(worker_config(ToySpec(vocab=16), (2, 1), 256))
            w.receive_data(await reader.read(65536), 0.0)
            writer.write(w.data_to_send() + _header("payload_len", 1 << 31))
            if not await reader.read(65536):
                closed.set()
        finally:  # from Python 3.12, leaving ``async with server`` waits for this close
            writer.close()

    server = await asyncio.start_server(rogue_worker, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        settings = _settings(VerifierSettings, worker=f"127.0.0.1:{port}", top_k=8)
        link, _s, metrics, _c = build_verifier(settings)
        stop = asyncio.Event()
        task = asyncio.create_task(link.run(stop))

        async def until_refused():
            while metrics.value("pp1q_validation_failures_total",
                                reason="frame_too_large") < 1:
                await asyncio.sleep(0.01)
            await asyncio.wait_for(closed.wait(), TIMEOUT_S)

        try:
            peak = await _traced(asyncio.wait_for(until_refused(), TIMEOUT_S))
        finally:
            stop.set()
            await asyncio.wait_for(task, TIMEOUT_S)
    assert peak < 16 << 20

