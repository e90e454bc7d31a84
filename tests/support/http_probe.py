"""One HTTP exchange with the verifier as a careless client makes it, and the check that
its answer is one the API documents (docs/operations.md, "HTTP API"): a 2xx of the
route's shape, or a 4xx with the JSON error body, or 503 ``busy``; never a 500, never
a hang past ANSWER_TIMEOUT_S."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import struct
from dataclasses import dataclass

ANSWER_TIMEOUT_S = 30.0  # one toy request of a few tokens: milliseconds; a hang fails
# what the API answers: 2xx, the documented 4xx (aiohttp's 400 among them), 503 when full
ALLOWED = {200, 400, 404, 405, 408, 413, 422, 503}
MAX_CHUNKS = 64  # pieces of one chunked body
RESET_MID_BODY = 0  # no status: the connection was reset while the body was being sent
SEE = {"/v1/generate": "generate", "/v1/completions": "openai", "/v1/chat/completions": "openai"}


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes


@dataclass
class Exchange:
    """What a client sends: the body bytes and how they travel."""

    method: str
    path: str
    body: bytes
    content_type: str | None = "application/json"
    chunked: bool = False  # Transfer-Encoding: chunked, in pieces of ``chunk`` bytes
    chunk: int = 7
    gzip: str | None = None  # Content-Encoding: gzip; the body "ok" compressed, compressed
    # with bytes after its end ("trailing"), or sent as it is ("not_gzip")

    @property
    def refused_as_it_arrives(self) -> bool:
        """A chunked body that does not inflate: refused at its first chunk, mid-send."""
        return self.chunked and self.gzip in ("not_gzip", "trailing")

    def send(self, port: int) -> Answer:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ANSWER_TIMEOUT_S)
        headers = {"Connection": "close"}
        if self.content_type is not None:
            headers["Content-Type"] = self.content_type
        body = self.body
        if self.gzip is not None:
            headers["Content-Encoding"] = "gzip"
            if self.gzip != "not_gzip":
                body = gzip.compress(body, mtime=0) + (b"x" if self.gzip == "trailing" else b"")
        try:
            try:
                if self.chunked:
                    # at most MAX_CHUNKS: a body the server does not read (GET /healthz)
                    # is drained for aiohttp's 1 s lingering time, then the connection
                    # is reset under a client still writing 1-byte chunks of 200 KB
                    size = max(self.chunk, -(-len(body) // MAX_CHUNKS))
                    pieces = [body[i:i + size] for i in range(0, len(body), size)]
                    conn.request(self.method, self.path, body=iter(pieces), headers=headers,
                                 encode_chunked=True)
                else:
                    conn.request(self.method, self.path, body=body, headers=headers)
            except (BrokenPipeError, ConnectionResetError):
                if not self.refused_as_it_arrives:
                    raise
                # answered (400 bad_body) and closed while the rest was still being sent:
                # the kernel may drop that answer with the RST (nothing left to check)
                return Answer(RESET_MID_BODY, "", b"")
            resp = conn.getresponse()
            return Answer(resp.status, resp.getheader("Content-Type", ""), resp.read())
        finally:
            conn.close()


def abandon(port: int, path: str, body: bytes, take: int, reset: bool) -> None:
    """A client that reads ``take`` bytes of its answer and leaves (``reset``: with an RST,
    as a killed process; else a FIN)."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S) as s:
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        got = 0
        while got < take:
            chunk = s.recv(take - got)
            if not chunk:
                break
            got += len(chunk)
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def check(ex: Exchange, a: Answer, vocab: int) -> None:
    """``a`` is a documented answer to ``ex`` (an AssertionError names what is not)."""
    where = f"{ex.method} {ex.path} {ex.body[:200]!r} -> {a.status} {a.body[:300]!r}"
    if a.status == RESET_MID_BODY:  # only a body refused as it arrived may meet this
        assert ex.refused_as_it_arrives, where
        return
    assert a.status in ALLOWED, where
    if a.status != 200:
        if a.content_type.startswith("text/plain"):  # aiohttp's own parser refusal
            assert a.status == 400, where
            return
        err = json.loads(a.body)["error"]
        assert isinstance(err["code"], str) and isinstance(err["message"], str), where
        assert a.status != 503 or err["code"] in ("busy", "stopping"), where
        return
    if a.content_type.startswith("text/event-stream"):
        _check_stream(a.body, vocab, where)
        return
    out = json.loads(a.body)
    kind = SEE.get(ex.path)
    if kind == "generate":
        ids = out["token_ids"]
        assert out["finish_reason"] in ("length", "stop"), where
    elif kind == "openai":
        ids = out["choices"][0]["token_ids"]
        assert out["usage"]["completion_tokens"] == len(ids), where
    else:
        return  # /healthz, /v1/models: JSON is all
    assert all(isinstance(t, int) and 0 <= t < vocab for t in ids), where


def _check_stream(body: bytes, vocab: int, where: str) -> None:
    events = [line[len(b"data: "):] for line in body.split(b"\n\n") if line.startswith(b"data: ")]
    assert events, where
    last = events[-1]
    if last != b"[DONE]":  # a stream that failed after its first tokens ends in an error
        assert "error" in json.loads(last), where
    for e in events[:-1]:
        chunk = json.loads(e)
        for choice in chunk.get("choices", []):
            assert all(0 <= t < vocab for t in choice["token_ids"]), where
