"""The verifier's HTTP error vocabulary: ``HttpError`` and the one status table.

The server itself is aiohttp (pp1q.verifier.server); this module holds what every HTTP
layer of the verifier shares. Every refusal is a JSON body in OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``: an ``HttpError`` raised by the
API's decoding or the server, or a domain error (``ServiceError``) that ``STATUS_OF``,
the only table from reasons to HTTP statuses, turns into one.
"""

from __future__ import annotations

import re

from pp1q.core.errors import Pp1qError, Reason, ServiceError

# where msgspec's refusals name the field: "... - at `$.a.b`" (the path to the value;
# a dict's key: "at `key` in `$.a`") and "unknown field `x`" / "missing required field
# `x`" (a key of the object at the path)
_AT_PATH = re.compile(r"(?:at|in) `\$\.([^`]+)`")
_KEY = re.compile(r"(?:unknown|missing required) field `([^`]+)`")


def param_of(message: str) -> str | None:
    """The request field a refusal's message names (``a.b``), or None."""
    path, key = _AT_PATH.search(message), _KEY.search(message)
    parts = [m.group(1) for m in (path, key) if m is not None]
    return ".".join(parts) or None


class HttpError(Pp1qError):
    """A request the HTTP layer refuses: an answer other than 200, with its error code
    and the request field it refuses (``param``: given, or read off the message)."""

    def __init__(self, status: int, code: str, message: str,
                 headers: dict[str, str] | None = None, param: str | None = None) -> None:
        super().__init__(Reason.BAD_REQUEST, message, message=message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}
        self.param = param if param is not None else param_of(message)


# The one table from domain errors to HTTP answers: reason -> (status, error code).
# The scheduler and its deciders raise ServiceError; nothing else picks a status.
STATUS_OF: dict[Reason, tuple[int, str]] = {
    Reason.QUEUE_FULL: (503, "busy"),
    Reason.TOO_MANY_QUEUED_FROM_ADDRESS: (503, "busy"),
    Reason.STOPPING: (503, "stopping"),
    Reason.RANKS_LOST: (503, "ranks_lost"),
    Reason.RANK_DISAGREEMENT: (500, "rank_disagreement"),
    Reason.GENERATIONS_EXHAUSTED: (500, "generations_exhausted"),
}


def as_http(e: ServiceError) -> HttpError:
    """The answer for a domain error (STATUS_OF; a reason without a row: 500 internal)."""
    status, code = STATUS_OF.get(e.reason, (500, "internal"))
    return HttpError(status, code, e.detail or e.reason.value)


# a handler's unexpected failure: the details are in the verifier's log, not the answer
INTERNAL = HttpError(500, "internal", "internal error; see the verifier log")


def error_body(e: HttpError) -> dict:
    """OpenAI's error object (its clients read ``message``, ``type``, ``param``, ``code``)."""
    kind = "invalid_request_error" if e.status < 500 else "server_error"
    return {"error": {"message": e.message, "type": kind, "param": e.param, "code": e.code}}
