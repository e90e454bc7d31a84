"""The HTTP connection gate's test rig: an HttpServer on 127.0.0.1 with one small route,
client connections from any 127/8 address, and a gate fed a transport's events by hand
(a recording handler in aiohttp's place)."""

from __future__ import annotations

import asyncio
import json
import socket

from link_harness import WAIT_S

from pp1q.core.errors import Reason
from pp1q.verifier.http_gate import Gates
from pp1q.verifier.server import HttpServer, Limits

GET = b"GET /small HTTP/1.1\r\nHost: a\r\n\r\n"


class Served:
    """An HttpServer on 127.0.0.1 with one small route, recording what the gate counts."""

    def __init__(self, limits: Limits, routes_: dict | None = None) -> None:
        self.refused: list[Reason] = []
        self.aborted: list[Reason] = []

        async def small(_request):
            return 200, {"pad": "x" * 200}

        self.server = HttpServer(routes_ or {("GET", "/small"): small}, limits,
                                 on_refused=self.refused.append, on_aborted=self.aborted.append)

    async def __aenter__(self):
        self.port = await self.server.start("127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc):
        await self.server.close()


async def connect(port: int, source: str = "127.0.0.1", rcvbuf: int | None = None):
    """A client connection from ``source`` (any 127/8 address is this machine's)."""
    sock = socket.socket()
    if rcvbuf is not None:  # before connecting: the window it offers stays this small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock, limit=1024)


async def status(port: int, source: str = "127.0.0.1") -> tuple[int, str]:
    """One GET /small from ``source``: the status and, for an error, its code."""
    reader, writer = await connect(port, source)
    try:
        writer.write(GET)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        body = json.loads(await asyncio.wait_for(reader.readexactly(length), WAIT_S))
        return int(head.split(b" ")[1]), body.get("error", {}).get("code", "")
    finally:
        writer.close()


class FedTransport:
    """What a Gate uses of a transport: its peer, its buffer, its marks, abort. With no
    socket the gate's proof that the client reads is the buffer going down."""

    def __init__(self, peer: str = "127.0.0.1") -> None:
        self.peer = (peer, 40000)
        self.aborted = self.closed = False
        self.sent = b""
        self.buffered = 1000  # bytes the "client" has not taken
        self.high: int | None = None

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = high

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str):
        return self.peer if name == "peername" else None

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


class RecordingHandler(asyncio.Protocol):
    """aiohttp's handler's place: records the events the gate hands on."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def connection_made(self, transport) -> None:
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.events.append("data")

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    def connection_lost(self, exc) -> None:
        self.events.append("lost")


def admitted(gates: Gates, peer: str) -> tuple:
    gate, transport = gates(), FedTransport(peer)
    gate.connection_made(transport)
    return gate, transport
