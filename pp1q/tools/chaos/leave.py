"""The soak's clients that leave: a request whose client closes its connection at a
random moment, mid-stream or before its answer, as a browser tab closed or a caller's
own timeout would.

Each such request opens its own connection (a raw socket, not the soak's keep-alive
``Client``), sends one request, plain (POST /v1/generate) or streamed (POST
/v1/completions with ``stream: true``), speculative or target-only, and closes the
connection: a plain request after a random wait, never reading the answer; a streamed
one after a random number of its server-sent events (or, drawn zero, after a random wait
within the first round). The stage it left at is what the client saw when it closed:

- ``before_answer``: plain, nothing of the answer had arrived;
- ``answer_unread``: plain, the answer (or its start) had arrived, unread: a short
  request can finish within the wait, so the server had nothing left to cancel;
- ``before_first_chunk``: streamed, no event had arrived (the headers come with the
  first round's tokens);
- ``mid_stream``: streamed, after one or more events;
- ``finished``: streamed, [DONE] came before the client meant to leave: not abandoned.

The draws come from the caller's generator (the soak's own, apart from the request mix).
"""

from __future__ import annotations

import json
import random
import select
import socket
import time
from dataclasses import dataclass

LEAVE_WAIT_MAX_S = 0.5  # a leaving client's wait: spans a request's first rounds (a 40 ms
# target step each in the soak) and some short requests' whole answer
LEAVE_EARLY_MAX_S = 0.02  # a streamed client drawn to leave before any event: within the
# first round (a 40 ms target step in the soak), before its tokens
LEAVE_EVENTS_MAX = 4  # a streamed client leaves after 0..4 events (one a round, and more)
READ_BYTES_MAX = 1 << 16  # what a streamed client reads before it leaves: ~60 events of
# a few ids each, past any LEAVE_EVENTS_MAX of them
RECV_CHUNK = 4096
STAGES = ("before_answer", "answer_unread", "before_first_chunk", "mid_stream")
FINISHED = "finished"


class HungError(Exception):
    """A leaving streamed client waited ``timeout_s`` for an event that never came."""


@dataclass(frozen=True)
class Plan:
    streamed: bool
    speculative: bool
    wait_s: float  # plain, or streamed with events == 0: how long after sending
    events: int  # streamed: leave after this many server-sent events


def draw(rng: random.Random, p: float) -> Plan | None:
    """With probability ``p`` a plan to leave (None: this request is read to its end)."""
    if p <= 0 or rng.random() >= p:
        return None
    streamed, speculative = rng.random() < 0.5, rng.random() < 0.5
    events = rng.randint(0, LEAVE_EVENTS_MAX)
    early = streamed and events == 0
    return Plan(streamed, speculative,
                wait_s=rng.uniform(0.0, LEAVE_EARLY_MAX_S if early else LEAVE_WAIT_MAX_S),
                events=events)


def body_of(plan: Plan, prompt: list[int] | str, max_tokens: int, seed: int,
            top_k: int | None) -> tuple[str, dict]:
    """The request's path and JSON body: the native API's fields, or OpenAI's (the
    prompt, token ids or text, and seed) with the ``pp1q`` extension for the rest."""
    if not plan.streamed:
        first = "prompt" if isinstance(prompt, str) else "prompt_token_ids"
        body = {first: prompt, "max_tokens": max_tokens, "seed": seed,
                "speculative": plan.speculative}
        if top_k is not None:
            body["top_k"] = top_k
        return "/v1/generate", body
    return "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "stream": True,
                               "seed": openai_seed(seed),
                               "pp1q": pp1q_ext(plan.speculative, top_k)}


def openai_seed(seed: int) -> int:
    """OpenAI's seeds are int64: the soak's 64-bit seed in two's complement."""
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def pp1q_ext(speculative: bool, top_k: int | None) -> dict:
    """The OpenAI routes' ``pp1q`` extension: speculative or not, and the proposal
    support (absent: the verifier's default, dense in the soak's rig)."""
    return {"speculative": speculative, **({"draft_top_k": top_k} if top_k is not None
                                           else {})}


def leave(host: str, port: int, plan: Plan, path: str, body: dict, timeout_s: float) -> str:
    """Send the request, leave as ``plan`` says; the stage it left at (or FINISHED).
    Raises HungError when a streamed client's next event took ``timeout_s``."""
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(head + data)
        if not plan.streamed or plan.events == 0:
            time.sleep(plan.wait_s)
            arrived = bool(select.select([s], [], [], 0)[0])
            if plan.streamed:
                return "mid_stream" if arrived and _events(s.recv(RECV_CHUNK)) \
                    else "before_first_chunk"
            return "answer_unread" if arrived else "before_answer"
        return _read_events(s, plan.events, timeout_s)
    # the with closes the socket: unread bytes in its buffer make that a reset


def _read_events(s: socket.socket, want: int, timeout_s: float) -> str:
    buf = b""
    while len(buf) < READ_BYTES_MAX:
        try:
            got = s.recv(RECV_CHUNK)
        except TimeoutError:
            raise HungError(f"a streamed client waited {timeout_s:g} s for an event "
                       f"({_events(buf)} read)") from None
        if not got:
            break  # the server closed it (an error event, or a bug): left anyway
        buf += got
        if b"data: [DONE]" in buf:
            return FINISHED
        if _events(buf) >= want:
            return "mid_stream"
    return "mid_stream" if _events(buf) else "before_first_chunk"


def _events(buf: bytes) -> int:
    """Server-sent JSON events in ``buf`` (each one chunk of the chunked body: the
    verifier writes an event at once)."""
    return buf.count(b"data: {")
