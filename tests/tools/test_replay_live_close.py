"""A live replay's connection ends after the worker's own close (pp1q.tools.replay.live):
the worker releases the session when it closes, and a replay of the same capture right
after met it live (session_in_use) when the worker was slow to close (seen under load in
test_replay_live)."""

import asyncio

from pp1q.tools.replay.live import LiveLink


class Core:
    """The replay core's two calls a connection's reader makes."""

    def received(self, conn: int, data: bytes) -> bool:
        return True

    def ended(self, conn: int) -> None:
        pass


async def test_close_returns_only_after_the_worker_closed_its_end():
    order = []

    async def slow_worker(reader, writer):
        while await reader.read(1024):  # until the replay's half-close
            pass
        await asyncio.sleep(0.2)  # a loaded worker, slow to see the close
        order.append("worker closed")
        writer.close()

    server = await asyncio.start_server(slow_worker, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        link = await LiveLink.connect(1, "127.0.0.1", port, Core(), wait_s=5.0)
        link.write(b"a frame")
        await link.close()
        order.append("replay closed")
    finally:
        server.close()
        await server.wait_closed()
    assert order == ["worker closed", "replay closed"]


async def test_a_worker_that_never_closes_costs_the_bounded_wait_only(monkeypatch):
    monkeypatch.setattr("pp1q.tools.replay.live.WORKER_CLOSE_WAIT_S", 0.1)
    held = []

    async def stubborn_worker(reader, writer):
        held.append(writer)  # reads nothing, never closes
        await asyncio.sleep(3600)

    server = await asyncio.start_server(stubborn_worker, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        link = await LiveLink.connect(1, "127.0.0.1", port, Core(), wait_s=5.0)
        await asyncio.wait_for(link.close(), 5.0)  # not the test's timeout: it returns
        assert link.writer.is_closing()
    finally:
        for w in held:
            w.close()
        server.close()

