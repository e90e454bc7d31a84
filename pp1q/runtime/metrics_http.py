"""/metrics over HTTP from a thread of its own, stoppable within a poll.

prometheus_client's ``start_http_server`` runs ``serve_forever`` at socketserver's
default poll of 0.5 s, so every daemon stop waited up to half a second in ``shutdown()``
(on the event loop). This is the same server (prometheus_client's WSGI app, its
threading WSGI server, a request log kept quiet) polled at POLL_S.
"""

from __future__ import annotations

import socket
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

POLL_S = 0.05  # how long shutdown() may wait for the serving thread; idle cost 20 wakes/s


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        """Scrapes are not logged: one line every few seconds per scraper is noise."""


def _server_class(host: str, port: int) -> type[ThreadingWSGIServer]:
    """The threading server for ``host``'s address family (an IPv6 host such as ``::``
    needs an AF_INET6 socket)."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]
    return type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})


def start_metrics_server(registry: CollectorRegistry, host: str, port: int):
    """Serve ``registry`` at http://host:port/metrics from a daemon thread; returns the
    server (``server_port``; stop it with ``shutdown()`` then ``server_close()``). Raises
    OSError when the port cannot be bound."""
    server = make_server(host, port, make_wsgi_app(registry), _server_class(host, port),
                         handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_S},
                     name="metrics-http", daemon=True).start()
    return server
