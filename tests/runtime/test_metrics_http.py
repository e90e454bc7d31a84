"""/metrics's server (pp1q.runtime.metrics_http) from outside: a client that opens
connections and says nothing, trickles its request or never reads its answer holds a
bounded number of threads for a bounded time, a scraper at another address is still
served, and the refusals and cuts show in the scrape, with no traceback per client."""

from __future__ import annotations

import select
import socket
import time

from new_threads import NewThreads
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from pp1q.runtime.metrics_http import (
    MAX_SCRAPE_CONNECTIONS,
    MAX_SCRAPE_CONNECTIONS_PER_ADDRESS,
    start_metrics_server,
)

WAIT_S = 10.0  # bound on every wait; each step takes milliseconds


class _Served:
    """A metrics server on 127.0.0.1 whose refusals count in its own registry."""

    def __init__(self, deadline_s: float = 30.0) -> None:
        self.registry = CollectorRegistry()
        self.refused = Counter("refused", "refused connections", registry=self.registry)
        self.aborted = Counter("aborted", "connections cut", registry=self.registry)
        self.server = start_metrics_server(self.registry, "127.0.0.1", 0,
                                           on_refused=self.refused.inc,
                                           on_aborted=self.aborted.inc, deadline_s=deadline_s)
        self.port = self.server.server_port
        self.silent: list[socket.socket] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for s in self.silent:
            s.close()
        self.server.shutdown()
        self.server.server_close()

    def hold(self, source: str, n: int) -> None:
        """``n`` connections from ``source`` that send half a request and wait."""
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", self.port), WAIT_S, (source, 0))
            s.sendall(b"GET /metrics HTTP/1.1\r\n")  # no end of head: the handler waits
            self.silent.append(s)

    def served_now(self) -> int:
        return self.server._counts.open

    def scrape(self, source: str) -> tuple[int, bytes]:
        """One GET /metrics from ``source``: its status and body."""
        with socket.create_connection(("127.0.0.1", self.port), WAIT_S, (source, 0)) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            raw = b""
            while chunk := s.recv(1 << 16):
                raw += chunk
        head, _, body = raw.partition(b"\r\n\r\n")
        return int(head.split(b" ")[1]), body


def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_one_silent_address_takes_its_share_and_a_scraper_elsewhere_is_served():
    with _Served() as m:
        m.hold("127.0.0.1", MAX_SCRAPE_CONNECTIONS_PER_ADDRESS)
        _until(lambda: m.served_now() == MAX_SCRAPE_CONNECTIONS_PER_ADDRESS, "never served")
        status, body = m.scrape("127.0.0.1")
        assert (status, body) == (503, b"too many /metrics clients\n")
        status, body = m.scrape("127.0.0.2")
        assert status == 200 and b"refused_total 1.0" in body  # the refusal, counted
        held = {"127.0.0.1": MAX_SCRAPE_CONNECTIONS_PER_ADDRESS}
        _until(lambda: m.server._counts.by_address == held,
               "the scraper's place was not given back")


def test_the_connections_served_at_once_are_bounded():
    per = MAX_SCRAPE_CONNECTIONS_PER_ADDRESS
    sources = [f"127.0.0.{i}" for i in range(2, 2 + MAX_SCRAPE_CONNECTIONS // per)]
    with _Served() as m:
        threads = NewThreads()  # not active_count(): an earlier test's threads end meanwhile
        for source in sources:
            m.hold(source, per)
        _until(lambda: m.served_now() == MAX_SCRAPE_CONNECTIONS, "never served")
        # the serving thread accepts in turn: the refused one came after the last thread
        # had started, and got none of its own
        assert m.scrape("127.0.0.200")[0] == 503
        assert len(threads.alive()) == MAX_SCRAPE_CONNECTIONS


def test_a_silent_connection_is_cut_at_its_deadline_quietly(capfd):
    with _Served(deadline_s=0.3) as m:
        m.hold("127.0.0.1", MAX_SCRAPE_CONNECTIONS_PER_ADDRESS)
        for s in m.silent:  # the server cuts each: the client reads the end
            s.settimeout(WAIT_S)
            assert s.recv(1024) == b""
        _until(lambda: m.served_now() == 0, "a closed connection kept its place")
        assert m.server._counts.by_address == {}
        assert m.aborted._value.get() == MAX_SCRAPE_CONNECTIONS_PER_ADDRESS
        assert m.scrape("127.0.0.1")[0] == 200  # its place back
    assert "Traceback" not in capfd.readouterr().err  # no traceback per client


def test_a_request_sent_a_byte_at_a_time_is_cut_at_its_deadline():
    """Each byte comes well within any per-read timeout; the whole request never does."""
    with _Served(deadline_s=0.5) as m, \
            socket.create_connection(("127.0.0.1", m.port), WAIT_S) as s:
        request = b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 100_000
        cut = False
        deadline = time.monotonic() + WAIT_S
        for byte in request:
            if time.monotonic() > deadline:
                break
            try:
                s.send(bytes([byte]))
            except OSError:  # reset: the server has cut it
                cut = True
                break
            if select.select([s], [], [], 0.02)[0]:  # readable: its end, or a reset
                cut = True
                break
        assert cut, "a trickled request kept its connection"
        _until(lambda: m.served_now() == 0, "a cut connection kept its place")
        assert m.aborted._value.get() == 1


class _Large:
    """A collector whose scrape is ``size`` bytes or more: more than the socket buffers
    take, so the server's write waits on the client."""

    def __init__(self, size: int) -> None:
        self.names = [f"pad_{i:06d}" for i in range(size // 40)]

    def collect(self):
        for name in self.names:
            yield GaugeMetricFamily(name, "", value=1.0)


def test_a_client_that_never_reads_its_answer_is_cut_at_its_deadline_quietly(capfd):
    with _Served(deadline_s=0.5) as m:
        m.registry.register(_Large(16 << 20))
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
        s.settimeout(WAIT_S)
        with s:
            s.connect(("127.0.0.1", m.port))
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            _until(lambda: m.aborted._value.get() == 1, "a client that read nothing kept "
                   "its connection")
            _until(lambda: m.served_now() == 0, "a cut connection kept its place")
    assert "Traceback" not in capfd.readouterr().err  # wsgiref's, per client
