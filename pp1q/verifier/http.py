"""The verifier's HTTP error vocabulary: ``HttpError`` and the one status table.

The server itself is aiohttp (pp1q.verifier.server); this module holds what every HTTP
layer of the verifier shares. Every refusal is a JSON body
``{"error": {"code": ..., "message": ...}}``: an ``HttpError`` raised by the API's
decoding or the server, or a domain error (``ServiceError``) that ``STATUS_OF``, the
only table from reasons to HTTP statuses, turns into one.
"""

from __future__ import annotations

from pp1q.core.errors import Pp1qError, Reason, ServiceError


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


def error_body(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}
