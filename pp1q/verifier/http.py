"""A small HTTP/1.1 JSON server for the verifier API (no new dependency).

The head parser is a pure function (``parse_head``), the asyncio part only reads a
bounded head, a bounded body and writes one JSON response per request, keeping the
connection open for the next one (HTTP/1.1 keep-alive) unless the client closes.
Every refusal is a JSON body ``{"error": {"code": ..., "message": ...}}``: an ``HttpError``
raised here or by the API's decoding, or a domain error (``ServiceError``) that
``STATUS_OF``, the only table from reasons to HTTP statuses, turns into one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pp1q.core.errors import Pp1qError, Reason, ServiceError

log = logging.getLogger("pp1q.http")

MAX_HEAD_BYTES = 16 * 1024  # request line + headers; the API needs a few hundred bytes
MAX_HEADERS = 64  # more header lines than any client of this API sends
MAX_BODY_BYTES = 1 << 20  # a prompt of ~100k token ids in JSON fits in 1 MiB
IDLE_TIMEOUT_S = 60.0  # an idle keep-alive connection is closed after this long
BODY_TIMEOUT_S = 30.0  # a declared body must arrive within this time (slowloris bound)

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
            415: "Unsupported Media Type", 422: "Unprocessable Content",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            501: "Not Implemented", 503: "Service Unavailable", 505: "HTTP Version Not Supported"}


class HttpError(Pp1qError):
    """A request the HTTP layer refuses: an answer other than 200, with its error code."""

    def __init__(self, status: int, code: str, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(Reason.BAD_REQUEST, message, message=message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}


# The one table from domain errors to HTTP answers: reason -> (status, error code).
# The scheduler and its deciders raise ServiceError; nothing else picks a status.
STATUS_OF: dict[Reason, tuple[int, str]] = {
    Reason.QUEUE_FULL: (503, "busy"),
    Reason.RANKS_LOST: (503, "ranks_lost"),
    Reason.RANK_DISAGREEMENT: (500, "rank_disagreement"),
    Reason.GENERATIONS_EXHAUSTED: (500, "generations_exhausted"),
}


def as_http(e: ServiceError) -> HttpError:
    """The answer for a domain error (STATUS_OF; a reason without a row: 500 internal)."""
    status, code = STATUS_OF.get(e.reason, (500, "internal"))
    return HttpError(status, code, e.detail or e.reason.value)


@dataclass
class RequestHead:
    method: str
    path: str
    version: str
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names

    @property
    def keep_alive(self) -> bool:
        conn = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return conn == "keep-alive"
        return conn != "close"

    def content_length(self) -> int:
        if "transfer-encoding" in self.headers:
            raise HttpError(411, "length_required", "send a Content-Length, not a chunked body")
        raw = self.headers.get("content-length")
        if raw is None:
            if self.method in ("POST", "PUT"):
                raise HttpError(411, "length_required", "Content-Length header required")
            return 0
        if not raw.isdigit() or len(raw) > 12:
            raise HttpError(400, "bad_content_length", f"Content-Length {raw!r}")
        n = int(raw)
        if n > MAX_BODY_BYTES:
            raise HttpError(413, "body_too_large", f"body of {n} bytes > {MAX_BODY_BYTES}")
        return n


def parse_head(raw: bytes) -> RequestHead:
    """Parse a request head (up to and including the blank line)."""
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError as e:  # latin-1 decodes every byte; kept for clarity
        raise HttpError(400, "bad_request", "undecodable head") from e
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith("/"):
        raise HttpError(400, "bad_request_line", "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, "bad_version", f"{version!r} not supported")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        if len(headers) >= MAX_HEADERS:
            raise HttpError(431, "too_many_headers", f"more than {MAX_HEADERS} headers")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "bad_header", "malformed header line")
        key = name.lower()
        if key in headers and key in ("content-length", "transfer-encoding"):
            raise HttpError(400, "bad_header", f"repeated {name}")
        headers[key] = value.strip()
    return RequestHead(method.upper(), target.split("?", 1)[0], version, headers)


Handler = Callable[[RequestHead, bytes], Awaitable[tuple[int, object]]]


def encode_response(status: int, body: object, keep_alive: bool,
                    extra: dict[str, str] | None = None) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode() + b"\n"
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
             "Content-Type: application/json",
             f"Content-Length: {len(payload)}",
             f"Connection: {'keep-alive' if keep_alive else 'close'}"]
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


def error_body(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


class HttpServer:
    """Routes ``(METHOD, path)`` to async handlers returning ``(status, json_body)``."""

    def __init__(self, routes: dict[tuple[str, str], Handler]) -> None:
        self.routes = routes
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port,
                                                  limit=MAX_HEAD_BYTES)
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            keep_alive = True
            while keep_alive:
                keep_alive = await self._one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader, writer) -> bool:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            writer.write(encode_response(431, error_body(
                "head_too_large", f"request head over {MAX_HEAD_BYTES} bytes"), False))
            await writer.drain()
            return False
        except (TimeoutError, asyncio.IncompleteReadError):
            return False
        head: RequestHead | None = None
        try:
            head = parse_head(raw)
            n = head.content_length()
            if n and head.headers.get("expect", "").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for it on >1 KB
            body = await asyncio.wait_for(reader.readexactly(n), BODY_TIMEOUT_S) if n else b""
            status, answer, extra = await self._dispatch(head, body)
        except HttpError as e:
            status, answer, extra = e.status, error_body(e.code, e.message), e.headers
        except TimeoutError:
            status, answer, extra = 408, error_body("body_timeout", "body did not arrive"), {}
        keep = head is not None and head.keep_alive and status < 500 and status not in (408, 413)
        writer.write(encode_response(status, answer, keep, extra))
        await writer.drain()
        return keep

    async def _dispatch(self, head: RequestHead, body: bytes):
        handler = self.routes.get((head.method, head.path))
        if handler is None:
            allowed = sorted(m for (m, p) in self.routes if p == head.path)
            if allowed:
                raise HttpError(405, "method_not_allowed", f"{head.method} {head.path}",
                                {"Allow": ", ".join(allowed)})
            raise HttpError(404, "not_found", f"no route {head.path}")
        try:
            status, answer = await handler(head, body)
        except HttpError:
            raise
        except ServiceError as e:
            raise as_http(e) from None
        except Exception:
            log.exception("handler for %s %s failed", head.method, head.path)
            return 500, error_body("internal", "internal error; see the verifier log"), {}
        return status, answer, {}
