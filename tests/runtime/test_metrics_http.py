"""/metrics's server (pp1q.runtime.metrics_http) from outside: a client that opens
connections and says nothing holds a bounded number of threads for a bounded time, a
scraper at another address is still served, and the refusals show in the scrape."""

from __future__ import annotations

import socket
import threading
import time

from prometheus_client import CollectorRegistry, Counter

from pp1q.runtime.metrics_http import (
    MAX_SCRAPE_CONNECTIONS,
    MAX_SCRAPE_CONNECTIONS_PER_ADDRESS,
    start_metrics_server,
)

WAIT_S = 10.0  # bound on every wait; each step takes milliseconds


class _Served:
    """A metrics server on 127.0.0.1 whose refusals count in its own registry."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.registry = CollectorRegistry()
        self.refused = Counter("refused", "refused connections", registry=self.registry)
        self.server = start_metrics_server(self.registry, "127.0.0.1", 0,
                                           on_refused=self.refused.inc, timeout_s=timeout_s)
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
        threads = threading.active_count()
        for source in sources:
            m.hold(source, per)
        _until(lambda: m.served_now() == MAX_SCRAPE_CONNECTIONS, "never served")
        assert m.scrape("127.0.0.200")[0] == 503
        assert threading.active_count() == threads + MAX_SCRAPE_CONNECTIONS


def test_a_silent_connection_is_closed_after_the_timeout_quietly(capfd):
    with _Served(timeout_s=0.3) as m:
        m.hold("127.0.0.1", MAX_SCRAPE_CONNECTIONS_PER_ADDRESS)
        for s in m.silent:  # the server closes each: the client reads the end
            s.settimeout(WAIT_S)
            assert s.recv(1024) == b""
        _until(lambda: m.served_now() == 0, "a closed connection kept its place")
        assert m.server._counts.by_address == {}
        assert m.scrape("127.0.0.1")[0] == 200  # its place back
    assert "Exception occurred" not in capfd.readouterr().err  # no traceback per client
