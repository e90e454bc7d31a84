"""/metrics over HTTP from a thread of its own, stoppable within a poll, bounded.

prometheus_client's ``start_http_server`` runs ``serve_forever`` at socketserver's
default poll of 0.5 s, so every daemon stop waited up to half a second in ``shutdown()``
(on the event loop). This is the same server (prometheus_client's WSGI app, its
threading WSGI server, a request log kept quiet) polled at POLL_S, with two bounds the
original lacks: it starts a thread per connection, and a connection that sends nothing
kept its thread for good, so a client could hold any number of threads (one that opens
connections and stays silent). Here at most MAX_SCRAPE_CONNECTIONS are served at once, at
most MAX_SCRAPE_CONNECTIONS_PER_ADDRESS from one client address (more are answered 503
and closed, counted), and each connection has SCRAPE_DEADLINE_S from its accept for the
whole exchange: its request in, its answer out. A per-read timeout would not do: a client
that sends a byte a second, or takes its answer a byte a second, never trips one. The
serving thread's poll cuts a connection past its deadline (counted), which wakes its
thread with an end of file or a broken pipe, both of which end it quietly.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
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
# a connection's whole exchange, request in and answer out, from its accept: Prometheus's
# own default scrape_timeout, past which the scrape has failed at the scraper anyway
SCRAPE_DEADLINE_S = 10.0
# the socket's own timeout is the deadline plus this: the poll cuts first, and the timeout
# only backs it up should the serving thread be late (its TimeoutError in a write would
# print wsgiref's traceback, where a cut's broken pipe ends the answer quietly)
SOCKET_TIMEOUT_MARGIN_S = 5.0
_BUSY_BODY = b"too many /metrics clients\n"
BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: "
        b"%d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


class _QuietHandler(WSGIRequestHandler):
    timeout = SCRAPE_DEADLINE_S + SOCKET_TIMEOUT_MARGIN_S  # socketserver sets it on the socket

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        """Scrapes are not logged: one line every few seconds per scraper is noise."""

    def parse_request(self) -> bool:
        """A connection cut at its deadline reads as a request that ended early; it is not
        answered (no registry collection for a client already gone)."""
        return super().parse_request() and self.server.serving(self.request)


class _BoundedServer(ThreadingWSGIServer):
    """prometheus_client's threading server, with at most MAX_SCRAPE_CONNECTIONS threads,
    MAX_SCRAPE_CONNECTIONS_PER_ADDRESS of them for one client address (an IPv6 one's /64),
    each connection cut ``deadline_s`` after its accept."""

    on_refused: Callable[[], None] = staticmethod(lambda: None)
    on_aborted: Callable[[], None] = staticmethod(lambda: None)
    deadline_s = SCRAPE_DEADLINE_S
    # the listen backlog: socketserver's 5 made a burst of connections wait for SYN retries
    request_queue_size = MAX_SCRAPE_CONNECTIONS

    def server_activate(self) -> None:
        super().server_activate()
        self._lock = threading.Lock()  # the serving thread admits, each connection's releases
        self._counts = AddressCounts(MAX_SCRAPE_CONNECTIONS, MAX_SCRAPE_CONNECTIONS_PER_ADDRESS)
        # the connections being served, each with its deadline; a socket leaves it (under
        # the lock) before it is closed, so a cut never reaches a closed socket's number
        # that a new connection may already have
        self._deadlines: dict[socket.socket, float] = {}

    def _admit(self, address: str, request: socket.socket) -> bool:
        with self._lock:
            if self._counts.admit(address) is not None:
                return False
            self._deadlines[request] = time.monotonic() + self.deadline_s
            return True

    def _release(self, address: str) -> None:
        with self._lock:
            self._counts.release(address)

    def serving(self, request: socket.socket) -> bool:
        """Whether ``request`` is still served (not cut at its deadline)."""
        with self._lock:
            return request in self._deadlines

    def service_actions(self) -> None:
        """Each poll (POLL_S) and after each accept: cut the connections past their
        deadline. shutdown() wakes a thread blocked reading (end of file) or writing
        (broken pipe); its own finish closes the socket and gives the place back."""
        now = time.monotonic()
        with self._lock:
            late = [r for r, deadline in self._deadlines.items() if deadline <= now]
            for request in late:
                del self._deadlines[request]
                with contextlib.suppress(OSError):  # the client reset it already
                    request.shutdown(socket.SHUT_RDWR)
        for _ in late:
            self.on_aborted()

    def shutdown_request(self, request) -> None:
        with self._lock:
            self._deadlines.pop(request, None)
        super().shutdown_request(request)

    def process_request(self, request, client_address) -> None:
        address = _client(client_address)
        if not self._admit(address, request):
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
            self._release(address)  # no thread started (none left, say); socketserver
            raise  # then closes the socket, through shutdown_request: its deadline goes

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


def _server_class(host: str, port: int, deadline_s: float) -> type[_BoundedServer]:
    """The bounded server for ``host``'s address family (an IPv6 host such as ``::``
    needs an AF_INET6 socket), its connections cut ``deadline_s`` after their accept."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]
    return type("MetricsServer", (_BoundedServer,),
                {"address_family": family, "deadline_s": deadline_s})


def start_metrics_server(registry: CollectorRegistry, host: str, port: int,
                         on_refused: Callable[[], None] | None = None,
                         on_aborted: Callable[[], None] | None = None,
                         deadline_s: float = SCRAPE_DEADLINE_S):
    """Serve ``registry`` at http://host:port/metrics from a daemon thread; returns the
    server (``server_port``; stop it with ``shutdown()`` then ``server_close()``). Raises
    OSError when the port cannot be bound. ``on_refused()``: a connection over a bound
    was answered 503 and closed; ``on_aborted()``: a connection was cut at its deadline
    (both called from the serving thread); ``deadline_s``: how long a connection's whole
    exchange may take (tests shorten it)."""
    handler = type("MetricsHandler", (_QuietHandler,),
                   {"timeout": deadline_s + SOCKET_TIMEOUT_MARGIN_S})
    server = make_server(host, port, make_wsgi_app(registry),
                         _server_class(host, port, deadline_s), handler_class=handler)
    # before the serving thread starts: nothing refused or cut yet
    if on_refused is not None:
        server.on_refused = on_refused
    if on_aborted is not None:
        server.on_aborted = on_aborted
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_S},
                     name="metrics-http", daemon=True).start()
    return server
