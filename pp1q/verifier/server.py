"""The verifier's HTTP server: aiohttp with pp1q's limits, JSON errors and cancellation.

aiohttp parses HTTP/1.1 (framing, pipelining, chunked bodies, malformed heads: a 400
and the connection closed); this module only sets its bounds and turns every refusal
into the API's JSON error body (pp1q.verifier.http). A handler takes the
``web.Request`` and returns ``(status, json_body)`` or a prepared ``web.StreamResponse``
(server-sent events). A client that disconnects cancels its handler
(``handler_cancellation``), so the scheduler's release path frees its slot and RESETs
the worker's context at once instead of generating into a closed socket. Connections
meet pp1q.verifier.http_gate first: the connection bounds (in all, and per client
address) and the write-stall deadline for a client that stops reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from pp1q.core.errors import Reason, ServiceError
from pp1q.runtime.address_counts import client_address
from pp1q.runtime.settings import DEFAULT_HTTP_CONNECTIONS_PER_ADDRESS, MAX_HTTP_CONNECTIONS
from pp1q.verifier.http import INTERNAL, HttpError, as_http, error_body
from pp1q.verifier.http_gate import RECLAIM_STALL_S, WRITE_STALL_S, Gate, Gates

log = logging.getLogger("pp1q.http")
# aiohttp logs a traceback for every malformed request it answers 400: the client's fault,
# and a log line per bad request would let any client fill the disk
_parser_log = logging.getLogger("pp1q.http.malformed")
_parser_log.setLevel(logging.CRITICAL)

MAX_BODY_BYTES = 1 << 20  # a prompt of ~100k token ids in JSON fits in 1 MiB
MAX_LINE_BYTES = 8 * 1024  # request line or one header line; the API needs a few hundred
MAX_HEADERS = 64  # more header lines than any client of this API sends
# the connection bounds are the settings' (MAX_HTTP_CONNECTIONS: with MAX_BODY_BYTES, the
# bodies buffered at once are 512 MiB at worst); the write-stall deadline is http_gate's
HEAD_TIMEOUT_S = 15.0  # a whole request head (or an idle keep-alive gap) within this (slowloris)
BODY_TIMEOUT_S = 30.0  # a declared body must arrive within this time (slow-body bound)
# closing: handlers still running this long after the drain are cancelled (the drain
# itself, pp1q.verifier.scheduler.Scheduler.drain, already gave them their deadline)
HANDLER_GRACE_S = 1.0
# closing: how long the server waits for its connections after aiohttp's cleanup closed
# them (one whose client stopped reading never finishes closing; Python >= 3.12 waits)
CONNECTIONS_CLOSE_S = 1.0

Handler = Callable[[web.Request], Awaitable["tuple[int, object] | web.StreamResponse"]]


def waiting_for_request(handler: asyncio.Protocol) -> bool:
    """Whether aiohttp's handler for a connection is idle: no request queued or being
    answered, waiting for the next (its keep-alive close's own test, on its private
    ``_waiter``; tests/verifier/test_http_idle.py pins it to the aiohttp installed). On an
    aiohttp without it no connection is ever idle: none is taken for a newcomer as idle."""
    waiter = getattr(handler, "_waiter", None)
    return waiter is not None and not waiter.done()


# aiohttp's own refusals (router, body size), as the API's error codes
_CODE_OF = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large",
            400: "bad_request", 408: "body_timeout"}


@dataclass(frozen=True)
class Limits:
    """The server's bounds; tests shorten the timeouts."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_line_bytes: int = MAX_LINE_BYTES
    max_headers: int = MAX_HEADERS
    max_connections: int = MAX_HTTP_CONNECTIONS
    max_connections_per_address: int = DEFAULT_HTTP_CONNECTIONS_PER_ADDRESS  # 0: none
    head_timeout_s: float = HEAD_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    write_stall_s: float = WRITE_STALL_S
    reclaim_stall_s: float = RECLAIM_STALL_S


DEFAULT_LIMITS = Limits()
LIMITS = web.AppKey("limits", Limits)


def json_response(status: int, body: object, headers: dict[str, str] | None = None):
    return web.Response(status=status, headers=headers,
                        body=json.dumps(body, separators=(",", ":")).encode() + b"\n",
                        content_type="application/json")


def request_address(request: web.Request) -> str:
    """The client address a request counts against (its share of the slot queue): as
    the connection gate counts it (an IPv6 client's /64); "" when the peer is gone."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return client_address(peer) if peer else ""


async def read_body(request: web.Request) -> bytes:
    """The whole body, bounded in size (client_max_size: 413) and in time (408); one
    aiohttp cannot read (its Content-Encoding does not inflate): 400 ``bad_body``."""
    lim = request.app[LIMITS]
    timeout = lim.body_timeout_s
    if (request.content_length or 0) > lim.max_body_bytes:  # refused from the header alone
        raise HttpError(413, "body_too_large",
                        f"declared body of {request.content_length} bytes > {lim.max_body_bytes}")
    # the connection's gate (every connection this server serves has one): while the body
    # trickles in, a full server may give the place to a new address (http_gate.reclaim)
    gate = request.transport.get_protocol() if request.transport is not None else None
    watched = isinstance(gate, Gate)
    if watched:
        gate.awaiting_body(True)
    try:
        return await asyncio.wait_for(request.read(), timeout)
    except TimeoutError:
        raise HttpError(408, "body_timeout", f"body did not arrive within {timeout:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise HttpError(413, "body_too_large",
                        f"body over {lim.max_body_bytes} bytes") from None
    except RequestPayloadError as e:  # aiohttp could not read it (a Content-Encoding that
        # does not inflate): the client's fault, not a 500 and a traceback each time
        why = str(e).split("message:", 1)[-1].strip()  # aiohttp's "400, message:\n  ..."
        raise HttpError(400, "bad_body", f"the body could not be read: {why}") from None
    finally:
        if watched:
            gate.awaiting_body(False)


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        answer = await handler(request)
    except HttpError as e:
        return json_response(e.status, error_body(e), e.headers)
    except ServiceError as e:
        h = as_http(e)
        return json_response(h.status, error_body(h))
    except web.HTTPException as e:  # the router's 404/405
        headers = {k: v for k, v in e.headers.items() if k.lower() == "allow"}
        code = _CODE_OF.get(e.status, "http_error")
        return json_response(e.status, error_body(HttpError(
            e.status, code, f"{request.method} {request.path}: {e.reason}")), headers)
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        log.exception("handler for %s %s failed", request.method, request.path)
        return json_response(500, error_body(INTERNAL))
    if isinstance(answer, web.StreamResponse):
        return answer
    status, body = answer
    return json_response(status, body)


class HttpServer:
    """Routes ``(METHOD, path)`` to handlers, on one listening socket."""

    def __init__(self, routes: dict[tuple[str, str], Handler],
                 limits: Limits = DEFAULT_LIMITS,
                 on_refused: Callable[[Reason], None] | None = None,
                 on_aborted: Callable[[Reason], None] | None = None) -> None:
        """``on_refused(reason)``: a connection was answered 503 unparsed (counted);
        ``on_aborted(reason)``: an admitted connection was aborted (a stalled client)."""
        self.limits = limits
        self.on_refused = on_refused
        self.on_aborted = on_aborted
        self.app = web.Application(client_max_size=limits.max_body_bytes, middlewares=[_errors])
        self.app[LIMITS] = limits
        for (method, path), handler in routes.items():
            if method == "GET":  # and HEAD, its headers only (health checks send HEAD)
                self.app.router.add_get(path, handler, allow_head=True)
            else:
                self.app.router.add_route(method, path, handler)
        self._runner: web.AppRunner | None = None
        self.gates: Gates | None = None  # the open connections, once started
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> int:
        lim = self.limits
        # keepalive_timeout is aiohttp's only head deadline: it runs from the connection's
        # start (and from each response) until a whole request head arrived, however
        # slowly its bytes trickle in, then closes the connection
        self._runner = web.AppRunner(
            self.app, handle_signals=False, access_log=None, logger=_parser_log,
            handler_cancellation=True, keepalive_timeout=lim.head_timeout_s,
            max_line_size=lim.max_line_bytes, max_field_size=lim.max_line_bytes,
            max_headers=lim.max_headers, lingering_time=1.0, shutdown_timeout=HANDLER_GRACE_S)
        await self._runner.setup()
        self.gates = Gates(lim, self._runner.server, self.on_refused, self.on_aborted,
                           waiting_for_request)
        self._server = await asyncio.get_running_loop().create_server(
            self.gates, host, port, backlog=min(lim.max_connections, 1024))
        return self._server.sockets[0].getsockname()[1]

    def stop_accepting(self) -> None:
        """No new connections (the listening socket closes); open ones are still served."""
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.cleanup()
        if self._server is not None:
            # From Python 3.12 wait_closed waits for every connection, and one whose client
            # stopped reading a large response never closes (its buffer never drains):
            # drop such clients (3.13 has abort_clients) and bound the wait in any case
            if hasattr(self._server, "abort_clients"):
                self._server.abort_clients()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), CONNECTIONS_CLOSE_S)
