"""``pp1q.runtime.capture.tap``: transparent wrapping of asyncio protocols, protocol sniffing."""

import asyncio

from pp1q.runtime.capture import CaptureWriter, Direction, Kind, Role, read_capture, tap
from pp1q.wire import MAGIC

WAIT_S = 10.0  # loopback echo round trips take milliseconds


class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data.upper())


class BufferedEcho(asyncio.BufferedProtocol):
    def __init__(self):
        self.buf = bytearray(5)  # small on purpose: data arrives over several reads

    def connection_made(self, transport):
        self.transport = transport

    def get_buffer(self, sizehint):
        return memoryview(self.buf)

    def buffer_updated(self, nbytes):
        self.transport.write(bytes(self.buf[:nbytes]).upper())


async def _exchange(tmp_path, server_factory, payloads):
    cap = CaptureWriter(tmp_path / "t", role=Role.WORKER)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(tap(server_factory, cap), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = b""
    for p in payloads:
        writer.write(p)
        await writer.drain()
        got += await asyncio.wait_for(reader.readexactly(len(p)), WAIT_S)
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    for _ in range(500):  # the server side sees the close a moment later (bounded wait)
        if cap._next_conn > 1 and not cap._open:  # opened (perhaps only at close) and closed
            break
        await asyncio.sleep(0.01)
    cap.close()
    return got, read_capture(cap.path)[1]


def _streams(recs):
    ins = b"".join(r.body for r in recs if r.direction is Direction.IN)
    outs = b"".join(r.body for r in recs if r.direction is Direction.OUT)
    return ins, outs


async def test_plain_protocol_is_recorded_both_ways(tmp_path):
    msgs = [MAGIC + b"abc", b"defgh"]
    got, recs = await _exchange(tmp_path, Echo, msgs)
    assert got == b"".join(msgs).upper()  # behaviour unchanged
    assert recs[0].kind is Kind.OPEN and recs[0].meta["protocol"] == "wire"
    assert recs[0].meta["peer"].startswith("127.0.0.1:")
    assert _streams(recs) == (b"".join(msgs), got)
    assert recs[-1].kind is Kind.CLOSE


async def test_buffered_protocol_reads_into_its_own_buffer(tmp_path):
    msgs = [MAGIC + b"0123456789", b"xyz"]
    got, recs = await _exchange(tmp_path, BufferedEcho, msgs)
    assert got == b"".join(msgs).upper()
    assert recs[0].meta["protocol"] == "wire"
    assert _streams(recs) == (b"".join(msgs), got)
    assert max(len(r.body) for r in recs if r.direction is Direction.IN) <= 5


async def test_every_connection_is_recorded_as_wire_whatever_it_sends(tmp_path):
    """Revision 2 has one protocol per port: nothing is sniffed; replay's FrameDecoder
    refuses foreign bytes (bad_magic) where a sniffer used to call them "unknown"."""
    _, recs = await _exchange(tmp_path, Echo, [b"GET / HTTP/1.1\r\n"])
    assert recs[0].meta["protocol"] == "wire"
    _, recs = await _exchange(tmp_path, Echo, [MAGIC[:3]])  # closed after 3 bytes
    assert recs[0].meta["protocol"] == "wire" and _streams(recs)[0] == MAGIC[:3]


def test_no_writer_means_no_wrapper():
    def factory():
        return Echo()
    assert tap(factory, None) is factory


async def test_wrapper_forwards_flow_control_and_attributes(tmp_path):
    class Flow(Echo):
        paused = 0
        marker = "inner attribute"

        def pause_writing(self):
            self.paused += 1

        def resume_writing(self):
            self.paused -= 1

    cap = CaptureWriter(tmp_path / "f", role=Role.VERIFIER)
    wrapped = tap(Flow, cap, "wire")()
    wrapped.pause_writing()
    assert wrapped.inner.paused == 1 and wrapped.marker == "inner attribute"
    wrapped.resume_writing()
    assert wrapped.inner.paused == 0
    cap.close()
