"""The comparison columns of a bench round: raw blocking sockets and pyzmq, each sending
the very frames of ours (pp1q.tools.bench.round_peer builds them and serves the other
end in a child process), one round at a time.

- ``RawClient``: the STEP stand-in out, every byte of the round received into one
  preallocated buffer with recv_into (the physical floor for these bytes through the
  kernel);
- ``ZmqClient``: pyzmq PAIR sockets, zero-copy multipart receive, msgspec headers (the
  vLLM engine-core style); ``zmq_missing`` says whether pyzmq is installed.

pp1q.tools.bench.round times them in turn with ours (``time_side_by_side``);
``time_raw`` times raw rounds back to back.
"""

from __future__ import annotations

import socket
import statistics
import time

import numpy as np

from pp1q.tools.bench.round_peer import (
    DEPTH,
    REQUESTS,
    STEP_BYTES_RAW,
    Peer,
    RequestHeader,
    RowHeader,
    frames,
)


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


class RawClient:
    """Raw rounds over one connection to a raw peer: the STEP stand-in out, then every
    byte of the round's frames received into one preallocated buffer."""

    def __init__(self, form: str, per_row: bool = False) -> None:
        self.total = sum(len(h) + len(p) for h, p in frames(form, per_row))
        self.buf = memoryview(bytearray(self.total))
        self.step = bytes(STEP_BYTES_RAW)
        self.peer = Peer("raw-rows" if per_row else "raw", form)
        try:
            self.sock = socket.create_connection(("127.0.0.1", self.peer.port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            self.peer.close()
            raise

    def round(self) -> float:
        t0 = time.perf_counter()
        self.sock.sendall(self.step)
        got = 0
        while got < self.total:
            got += self.sock.recv_into(self.buf[got:])
        return time.perf_counter() - t0

    def close(self) -> None:
        self.sock.close()
        self.peer.close()


class ZmqClient:
    """pyzmq rounds (PAIR sockets, zero-copy multipart, msgspec headers) to a zmq peer."""

    def __init__(self, form: str) -> None:
        import msgspec
        import zmq

        self.sparse = form != "dense"
        self.dec = msgspec.msgpack.Decoder(RequestHeader if self.sparse else RowHeader)
        self.step = bytes(STEP_BYTES_RAW)  # made once, as RawClient's: not a round's work
        self.peer = Peer("zmq", form)
        self.ctx = zmq.Context()
        try:
            self.sock = self.ctx.socket(zmq.PAIR)
            self.sock.connect(f"tcp://127.0.0.1:{self.peer.port}")
        except zmq.ZMQError:
            self.ctx.term()
            self.peer.close()
            raise

    def round(self) -> float:
        t0 = time.perf_counter()
        self.sock.send(self.step)
        for _ in range(REQUESTS if self.sparse else REQUESTS * DEPTH):
            msg = self.sock.recv_multipart(copy=False)
            head = self.dec.decode(msg[0].buffer)
            if self.sparse:  # a request's rows: each its ids, then its q
                for i, n in enumerate(head.entries):
                    np.frombuffer(msg[1 + 2 * i].buffer, dtype="<i4", count=n)
                    np.frombuffer(msg[2 + 2 * i].buffer, dtype="<f4", count=n)
            else:
                np.frombuffer(msg[-1].buffer, dtype="<f4", count=head.entries)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()
        self.peer.close()


def block(client, rounds: int) -> float:
    """Median ms of ``rounds`` rounds back to back (the first dropped: connection warm-up)."""
    try:
        return median_ms([client.round() for _ in range(rounds)][1:])
    finally:
        client.close()


def time_raw(form: str, rounds: int, per_row: bool = False) -> float:
    """Median ms a round of raw sockets sending ours' frames, back to back (``per_row``:
    a sparse round framed as wire revision 2 did, a REPLY a row and a COMPLETION a
    request)."""
    return block(RawClient(form, per_row), rounds)


def zmq_missing() -> bool:
    try:
        import zmq  # noqa: F401
    except ImportError:
        return True
    return False
