"""Worker-side peers of ``pp1q bench round``, each run as a child process:

    python -m pp1q.tools.bench.round_peer {ours,ours-checked,raw,raw-rows,loop,zmq} {dense,sparse}

``ours``: the real worker adapter (WorkerConnection, WorkerEndpoint) answering STEPs with
canned q rows, so no model compute is timed; as the worker daemon runs by default,
without its own outgoing row checks (``ours-checked``: with them). ``raw``: blocking
sockets sending the very same frames ours sends (header and payload in one sendmsg per
frame: a dense round's REPLYs and COMPLETIONs, a sparse round's four PROPOSALs).
``loop``: the same frames from a uvloop BufferedProtocol, one write a frame, each in a loop
callback of its own as ours' drafting tasks write them, with no wire core: what an
event loop costs a round on its own (pp1q.tools.bench.loop_client is its other end).
``zmq``: pyzmq multipart messages of a msgspec header plus the same payload arrays (the
vLLM engine-core style), grouped as ours groups them (a message per dense row, one per
sparse request). Each prints ``port N`` once listening; ``Peer`` starts one from the
bench's side and reads it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys

import msgspec
import numpy as np

from pp1q.core import q_backend
from pp1q.core.q import build_row, sample
from pp1q.models.toy import ToySpec
from pp1q.runtime.metrics import Metrics
from pp1q.wire import Completion, Form, Status, Step, encode, proposal_from_rows, reply_from_row
from pp1q.wire.session_config import DEFAULT_MAX_SUPPORT, worker_config
from pp1q.wire.sessions import SessionTable
from pp1q.worker.connection import WorkerConnection
from pp1q.worker.drafting import Proposer

VOCAB = 129280
REQUESTS = 4
DEPTH = 5
TOP_K = 32
STEP_BYTES_RAW = 64  # the raw and zmq peers' stand-in for a STEP: a fixed small request


def canned_rows(form: str) -> list[list[tuple[int, object]]]:
    """[REQUESTS][DEPTH] (token, DyadicRow): fixed seeds, the same in every process."""
    rng = np.random.default_rng(2024)
    top_k = None if form == "dense" else TOP_K
    out = []
    for _ in range(REQUESTS):
        chain = []
        for _ in range(DEPTH):
            row = build_row(rng.normal(size=VOCAB) * 3.0, top_k=top_k)
            chain.append((sample(row, int(rng.integers(1 << 24))), row))
        out.append(chain)
    return out


def frames(form: str, per_row: bool = False) -> list[tuple[bytes, bytes]]:
    """The (header + control, payload) parts of every frame of a round as ours sends
    them: dense, every REPLY and COMPLETION; sparse, one PROPOSAL a request (``per_row``:
    a REPLY a row and a COMPLETION a request, as wire revision 2 sent sparse rows)."""
    out = []
    if form != "dense" and not per_row:
        for slot, chain in enumerate(canned_rows(form)):
            msg = proposal_from_rows(session=1, slot=slot, generation=1, round_id=1,
                                     first_position=11, context_version=0,
                                     tokens=[t for t, _ in chain], rows=[r for _, r in chain])
            data = encode(msg)
            n = 8 * sum(msg.entries)  # the payload: each row's ids and q
            out.append((data[: len(data) - n], data[len(data) - n:]))
        return out
    for slot, chain in enumerate(canned_rows(form)):
        for i, (token, row) in enumerate(chain, start=1):
            msg = reply_from_row(session=1, slot=slot, generation=1, round_id=1, index=i,
                                 position=10 + i, token=token, row=row,
                                 form=Form.DENSE if form == "dense" else Form.SPARSE)
            data = encode(msg)
            n = sum(len(p) for p in msg.payload_parts())
            out.append((data[: len(data) - n], data[len(data) - n:]))
        done = encode(Completion(session=1, slot=slot, generation=1, round_id=1,
                                 first_position=11, context_version=0, rows=DEPTH,
                                 reply_bytes=0, reply_checksum=0, status=int(Status.OK),
                                 reason=""))
        out.append((done, b""))
    return out


class Peer:
    """One peer of this module started as a child process (the bench's side of it): its
    ``port`` once it listens; ``checker``: the q-row checker it runs (PP1Q_VALIDATE)."""

    def __init__(self, mode: str, form: str, checker: str | None = None) -> None:
        from pp1q.core.q_backend import ENV
        from pp1q.runtime.launcher import daemon_env

        env = daemon_env() if checker is None else {**daemon_env(), ENV: checker}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pp1q.tools.bench.round_peer", mode, form],
            stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        if not line.startswith("port "):
            self.close()
            raise RuntimeError(f"{mode} peer did not start: {line!r}")
        self.port = int(line.split()[1])

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


# -- ours ------------------------------------------------------------------------


class CannedProposer(Proposer):
    """Replies with precomputed rows: the benchmark times transport, not the model."""

    def __init__(self, rows: dict[int, list[list[tuple[int, object]]]]) -> None:
        super().__init__(None)
        self.canned = rows

    def rows(self, step: Step, prefix: list[int]):
        yield from self.canned[step.top_k][step.slot % REQUESTS][: step.depth]


async def ours_server(form: str, check_outgoing: bool = False) -> asyncio.AbstractServer:
    """The worker daemon's adapter (WorkerConnection) with canned rows, listening on
    127.0.0.1 on the running loop: ``serve_ours``' server, or one on the bench's own loop
    (``pp1q.tools.bench.round.time_one_process``)."""
    proposer = CannedProposer({(0 if form == "dense" else TOP_K): canned_rows(form)})
    config = worker_config(ToySpec(vocab=VOCAB, seed=0), (2,), DEFAULT_MAX_SUPPORT)
    metrics, state = Metrics("worker"), SessionTable()
    return await asyncio.get_running_loop().create_server(
        lambda: WorkerConnection(config, state, proposer, metrics,
                                 check_outgoing=check_outgoing), "127.0.0.1", 0)


def serve_ours(form: str, check_outgoing: bool = False) -> None:
    import uvloop

    logging.basicConfig(level=logging.ERROR)
    q_backend.warm_up()  # as the worker daemon does at start (PP1Q_VALIDATE chooses)

    async def main() -> None:
        server = await ours_server(form, check_outgoing)
        print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


# -- raw -------------------------------------------------------------------------


def _listen() -> socket.socket:
    srv = socket.create_server(("127.0.0.1", 0))
    print(f"port {srv.getsockname()[1]}", flush=True)
    return srv


def serve_raw(form: str, per_row: bool = False) -> None:
    parts = frames(form, per_row)
    srv = _listen()
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    step = memoryview(bytearray(STEP_BYTES_RAW))
    while True:
        got = 0
        while got < STEP_BYTES_RAW:
            n = conn.recv_into(step[got:])
            if not n:
                return
            got += n
        for head, payload in parts:
            conn.sendmsg([head, payload] if payload else [head])


def serve_loop(form: str) -> None:
    """The ``loop`` peer: raw's frames from uvloop, nothing decoded, checked or framed."""
    import uvloop

    parts = [(head, payload) if payload else (head,) for head, payload in frames(form)]

    class LoopSender(asyncio.BufferedProtocol):  # not ``Peer``: that is the bench's side
        def __init__(self) -> None:
            self.step = memoryview(bytearray(STEP_BYTES_RAW))
            self.got = 0

        def connection_made(self, transport) -> None:
            self.transport = transport
            transport.get_extra_info("socket").setsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def get_buffer(self, sizehint: int) -> memoryview:
            return self.step[self.got:]

        def buffer_updated(self, nbytes: int) -> None:
            self.got += nbytes
            if self.got == STEP_BYTES_RAW:  # the STEP stand-in is whole: answer the round
                self.got = 0
                loop = asyncio.get_running_loop()
                for frame in parts:
                    loop.call_soon(self.transport.writelines, frame)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(LoopSender, "127.0.0.1", 0)
        print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


# -- zmq + msgspec ---------------------------------------------------------------


class RowHeader(msgspec.Struct, array_like=True):
    slot: int
    index: int
    token: int
    entries: int
    sparse: bool


class RequestHeader(msgspec.Struct, array_like=True):
    """The zmq peer's header of one sparse request: its rows' tokens and entry counts
    (the arrays follow, each row's ids then q)."""

    slot: int
    tokens: list[int]
    entries: list[int]


def serve_zmq(form: str) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(f"port {port}", flush=True)
    enc = msgspec.msgpack.Encoder()
    rows = canned_rows(form)
    sparse = form != "dense"
    msgs = []
    for slot, chain in enumerate(rows):
        if sparse:  # one message a request, as ours sends one PROPOSAL
            body = [a for _, row in chain
                    for a in (row.ids.astype("<i4"), row.to_sparse()[1].astype("<f4"))]
            msgs.append((RequestHeader(slot, [t for t, _ in chain],
                                       [int(r.ids.size) for _, r in chain]), body))
            continue
        for i, (token, row) in enumerate(chain, start=1):
            body = [row.to_dense()]
            msgs.append((RowHeader(slot, i, token, int(body[-1].size), sparse), body))
    while True:
        sock.recv(copy=False)  # the STEP stand-in
        for head, body in msgs:
            sock.send_multipart([enc.encode(head), *body], copy=False)


def main(argv: list[str]) -> int:
    mode, form = argv[:2]
    if mode == "ours-checked":  # the worker's own outgoing row checks switched on
        serve_ours(form, check_outgoing=True)
    elif mode == "raw-rows":  # sparse rows framed one a frame, as wire revision 2 did
        serve_raw(form, per_row=True)
    else:
        {"ours": serve_ours, "raw": serve_raw, "loop": serve_loop, "zmq": serve_zmq}[mode](form)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
