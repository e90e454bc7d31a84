"""/metrics over HTTP from a thread of its own, stoppable within a poll, bounded.

prometheus_client's ``start_http_server`` runs ``serve_forever`` at socketserver's
default poll of 0.5 s, so every daemon stop waited up to half a second in ``shutdown()``
(on the event loop). This is the same server (prometheus_client's WSGI app, its
threading WSGI server, a request log kept quiet) polled at POLL_S, with two bounds the
original lacks: it starts a thread per connection, and a connection that sends nothing
kept its thread for good, so a client could hold any number of threads (one that opens
connections and stays silent). Here a connection is served at most SCRAPE_TIMEOUT_S
without a byte, and at most MAX_SCRAPE_CONNECTIONS are served at once, at most
MAX_SCRAPE_CONNECTIONS_PER_ADDRESS from one client address; more are answered 503 and
closed, counted.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from pp1q.runtime.address_counts import AddressCounts
from pp1q.runtime.address_counts import client_address as _client

POLL_S = 0.05  # how long shutdown() may wait for the serving thread; idle cost 20 wakes/s
# connections served at once, each with its own thread (~30 KiB): scrapers and an
# operator's curl need a handful; past it a connection gets one 503 and is closed
MAX_SCRAPE_CONNECTIONS = 64
# one client address's share: a client that holds silent connections takes at most
# this many, and a Prometheus elsewhere still scrapes
MAX_SCRAPE_CONNECTIONS_PER_ADDRESS = 8
# a connection silent this long (in its request, or idle between requests) is closed: a
# scrape's request arrives at once, and a silent client holds its thread no longer
SCRAPE_TIMEOUT_S = 10.0
_BUSY_BODY = b"too many /metrics clients\n"
BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: "
        b"%d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


class _QuietHandler(WSGIRequestHandler):
    timeout = SCRAPE_TIMEOUT_S  # socketserver sets it on the connection's socket

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        """Scrapes are not logged: one line every few seconds per scraper is noise."""


class _BoundedServer(ThreadingWSGIServer):
    """prometheus_client's threading server, with at most MAX_SCRAPE_CONNECTIONS threads,
    MAX_SCRAPE_CONNECTIONS_PER_ADDRESS of them for one client address (an IPv6 one's /64)."""

    on_refused: Callable[[], None] = staticmethod(lambda: None)
    # the listen backlog: socketserver's 5 made a burst of connections wait for SYN retries
    request_queue_size = MAX_SCRAPE_CONNECTIONS

    def server_activate(self) -> None:
        super().server_activate()
        self._lock = threading.Lock()  # the serving thread admits, each connection's releases
        self._counts = AddressCounts(MAX_SCRAPE_CONNECTIONS, MAX_SCRAPE_CONNECTIONS_PER_ADDRESS)

    def _admit(self, address: str) -> bool:
        with self._lock:
            return self._counts.admit(address) is None

    def _release(self, address: str) -> None:
        with self._lock:
            self._counts.release(address)

    def process_request(self, request, client_address) -> None:
        address = _client(client_address)
        if not self._admit(address):
            self.on_refused()
            try:  # one 503 if the socket takes it now, never a wait on this client
                request.setblocking(False)
                request.send(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # its thread releases it
        except BaseException:
            self._release(address)  # no thread started (none left, say)
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(_client(client_address))

    def handle_error(self, request, client_address) -> None:
        """A client's timeout or reset is its own business: nothing on stderr for it (a
        line per silent connection would let any client fill the log)."""
        if not isinstance(sys.exception(), OSError):
            super().handle_error(request, client_address)


def _server_class(host: str, port: int) -> type[_BoundedServer]:
    """The bounded server for ``host``'s address family (an IPv6 host such as ``::``
    needs an AF_INET6 socket)."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]
    return type("MetricsServer", (_BoundedServer,), {"address_family": family})


def start_metrics_server(registry: CollectorRegistry, host: str, port: int,
                         on_refused: Callable[[], None] | None = None,
                         timeout_s: float = SCRAPE_TIMEOUT_S):
    """Serve ``registry`` at http://host:port/metrics from a daemon thread; returns the
    server (``server_port``; stop it with ``shutdown()`` then ``server_close()``). Raises
    OSError when the port cannot be bound. ``on_refused()``: a connection over a bound
    was answered 503 and closed (called from the serving thread); ``timeout_s``: how long
    a connection may stay silent (tests shorten it)."""
    handler = type("MetricsHandler", (_QuietHandler,), {"timeout": timeout_s})
    server = make_server(host, port, make_wsgi_app(registry), _server_class(host, port),
                         handler_class=handler)
    if on_refused is not None:  # before the serving thread starts: nothing refused yet
        server.on_refused = on_refused
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_S},
                     name="metrics-http", daemon=True).start()
    return server
