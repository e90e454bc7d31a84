"""A blocking client of the verifier's HTTP API (stdlib only)."""

from __future__ import annotations

import concurrent.futures as cf
import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

from pp1q.core.errors import Pp1qError, Reason

DEFAULT_URL = "http://127.0.0.1:8080"


class ApiError(Pp1qError):
    """The server answered with an error body, or could not be reached.

    ``reason``: UNREACHABLE (status 0), BAD_RESPONSE (not the API's JSON) or
    REQUEST_REFUSED (an error body: ``status`` and the server's ``code`` say which)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        reason = (Reason.UNREACHABLE if status == 0 else Reason.BAD_RESPONSE
                  if code == "bad_response" else Reason.REQUEST_REFUSED)
        # no status when nothing answered: "unreachable: URL: why", not "0 unreachable"
        head = code if status == 0 else f"{status} {code}"
        super().__init__(reason, message, message=f"{head}: {message}")
        self.status, self.code, self.message = status, code, message


class Client:
    """One keep-alive connection to a verifier (not thread-safe: one per thread)."""

    def __init__(self, url: str = DEFAULT_URL, timeout: float = 300.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"url {url!r}: need http://HOST:PORT")
        self.url = url
        self._conn = http.client.HTTPConnection(parts.hostname, parts.port or 80,
                                                timeout=timeout)

    def close(self) -> None:
        self._conn.close()

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        resp = self._send(method, path, payload, headers)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self._conn.close()
            raise ApiError(0, "unreachable", f"{self.url}: {e}") from None
        answer = self._json(resp.status, raw)
        if resp.status != 200:
            self._refused(resp.status, answer)
        return answer

    def _send(self, method: str, path: str, payload: bytes | None, headers: dict):
        try:
            self._conn.request(method, path, body=payload, headers=headers)
            return self._conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            self._conn.close()
            raise ApiError(0, "unreachable", f"{self.url}: {e}") from None

    def _json(self, status: int, raw: bytes):
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(status, "bad_response",
                           f"{self.url}: {raw[:200].decode('latin-1')}") from None

    def _refused(self, status: int, answer) -> None:
        err = answer.get("error", {}) if isinstance(answer, dict) else {}
        raise ApiError(status, err.get("code", "error"), err.get("message", ""))

    def stream(self, prompt: list[int] | str, max_tokens: int, **body) -> Iterator[dict]:
        """POST /v1/completions with ``stream: true`` (``prompt``: token ids, or text on
        a real model); yields each server-sent event's
        JSON (chunks of ``token_ids`` as they are committed; the last one carries
        ``finish_reason`` and ``pp1q`` statistics). ``body``: OpenAI fields (seed,
        temperature, stop_token_ids, pp1q={...})."""
        payload = json.dumps({"prompt": prompt if isinstance(prompt, str) else list(prompt),
                              "max_tokens": max_tokens,
                              "stream": True, **body}).encode()
        resp = self._send("POST", "/v1/completions", payload,
                          {"Content-Type": "application/json"})
        if resp.status != 200:
            self._refused(resp.status, self._json(resp.status, resp.read()))
        try:
            for line in resp:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    resp.read()  # the chunked body's end: the connection serves the next call
                    return
                event = self._json(200, data)
                if "error" in event:
                    self._refused(200, event)
                yield event
        except (OSError, http.client.HTTPException) as e:
            self._conn.close()
            raise ApiError(0, "unreachable", f"{self.url}: {e}") from None
        self._conn.close()
        raise ApiError(0, "unreachable", f"{self.url}: the stream ended before [DONE]")

    def generate(self, prompt: list[int] | str, max_tokens: int, **options) -> dict:
        """POST /v1/generate; ``prompt``: token ids, or text (real models);
        ``options``: seed, speculative, temperature, top_k..."""
        first = {"prompt": prompt} if isinstance(prompt, str) else {
            "prompt_token_ids": list(prompt)}
        return self._call("POST", "/v1/generate", {**first, "max_tokens": max_tokens,
                                                   **options})

    def health(self) -> dict:
        return self._call("GET", "/healthz")

    def wait_connected(self, timeout: float) -> None:
        """Block until /healthz reports a live worker session (RuntimeError after timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.health().get("worker") == "connected":
                    return
            except ApiError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"no worker session within {timeout:g} s")


def run_batch(url: str, prompts: list[list[int] | str], max_tokens: int, *, concurrency: int,
              first_seed: int, options: dict | None = None,
              on_answer: Callable[[dict, float], None] | None = None) -> tuple[list[dict], float]:
    """POST one request per prompt (seeds first_seed, first_seed + 1, ...), ``concurrency``
    at a time, one keep-alive connection per thread. Returns (answers, seconds);
    ``on_answer(answer, elapsed)`` is called as each one arrives (under a lock)."""
    local = threading.local()
    lock = threading.Lock()
    t0 = time.perf_counter()

    def one(i: int) -> dict:
        if not hasattr(local, "client"):
            local.client = Client(url)
        answer = local.client.generate(prompts[i], max_tokens, seed=first_seed + i,
                                       **(options or {}))
        if on_answer is not None:
            with lock:
                on_answer(answer, time.perf_counter() - t0)
        return answer

    with cf.ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(one, range(len(prompts))))
    return answers, time.perf_counter() - t0
