"""The OpenAI routes' streams against their JSON answers, round by round: a scripted
scheduler (the rounds of committed ids it hands ``on_tokens``, as Scheduler.generate
hands them) behind the real routes and HttpServer on 127.0.0.1, so every chunk's
``token_ids`` and text, the usage and finish_reason are what a client reads."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from http_post import post_json
from stopper_cases import random_rounds

from pp1q.verifier.api import finish
from pp1q.verifier.detokenize import followable
from pp1q.verifier.openai_routes import openai_routes
from pp1q.verifier.server import HttpServer

pytestmark = pytest.mark.daemons  # binds a server on 127.0.0.1

WAIT_S = 10.0  # one answer of a few dozen ids from a scripted scheduler takes ms


class ScriptedScheduler:
    """Scheduler.generate's contract to its caller: each round's committed ids, cut at
    max_tokens (api.finish), handed to ``on_tokens``; a true return ends the request."""

    max_positions = None

    def __init__(self, rounds: list[list[int]]) -> None:
        self.rounds = rounds

    async def generate(self, req, on_tokens=None, address=""):
        done: list[int] = []
        shown, stopped = 0, False
        for new in self.rounds:
            await asyncio.sleep(0)  # a round's forward pass: the handler may write between
            done += new
            upto, _ = finish(done, req.max_tokens, req.stop_ids)
            stopped = bool(on_tokens(upto[shown:]))
            shown = len(upto)
            if stopped or len(upto) >= req.max_tokens:
                break
        tokens, reason = finish(done, req.max_tokens, req.stop_ids)
        return {"token_ids": tokens, "seed": req.seed, "finish_reason": reason,
                "stats": {}, "elapsed_s": 0.0}


async def _serve(rounds, tokenizer, body: dict, chat: bool = False,
                 stream_first: bool = True) -> tuple[dict, list]:
    """The JSON answer and the streamed events (chunks, then "[DONE]") for ``body``
    (``stream_first``: which is asked first, for a decoder the window follows wrongly,
    which the Stopper remembers)."""
    routes = openai_routes(ScriptedScheduler(rounds), model_id="m", tokenizer=tokenizer,
                           decode_kw={"vocab": 1 << 16, "default_top_k": None,
                                      "max_support": 64, "text": None},
                           check=lambda req: req, decoded=_inline)
    http = HttpServer(routes)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    try:
        port = await http.start("127.0.0.1", 0)
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        got = [await _post(port, path, b)
               for b in ((streamed, body) if stream_first else (body, streamed))]
        (raw, _), (answer, _) = got if stream_first else got[::-1]
    finally:
        await http.close()
    events = [e.removeprefix("data: ") for e in raw.decode().split("\n\n") if e]
    return json.loads(answer), [e if e == "[DONE]" else json.loads(e) for e in events]


async def _inline(fn, *args, **kw):
    return fn(*args, **kw)


async def _post(port: int, path: str, body: dict) -> tuple[bytes, int]:
    status, head, payload = await post_json(port, path, body, WAIT_S)
    if b"chunked" in head.lower():
        payload = _unchunk(payload)
    return payload, status


def _unchunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, data = out + rest[:n], rest[n + 2:]
    return out


def _streamed(events: list) -> tuple[list[int], str, str, int]:
    """A stream as a client adds it up: ids, text, finish_reason, usage's completion."""
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    return ids, text, chunks[-1]["choices"][0]["finish_reason"], events[-2]["usage"][
        "completion_tokens"]


class NotLocal:
    """One character an id, every fifth character of the whole text upper-cased: a
    decode whose text depends on more than the ids before it, which the window's own
    checks pass (its text counts from the window's start) and the answer's whole decode
    catches. No tokenizer we know decodes so; the fallback must still be consistent."""

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(t).upper() if k % 5 == 0 else chr(t) for k, t in enumerate(ids))


async def test_a_stream_adds_up_to_its_usage_where_the_window_was_wrong():
    """The answer's whole decode holds a stop string the window's text did not: its ids
    end up to a round back (no round is known), but never before the ids the stream
    already handed out, so the chunks add up to the usage. They were cut after the
    stream had shown them (seed 1: 40 ids streamed, usage 32)."""
    caught = 0
    for seed in range(40):
        rng, tok = random.Random(seed), NotLocal()
        ids = [rng.randrange(ord("a"), ord("f")) for _ in range(40)]
        whole = tok.decode(ids)
        i = 5 * rng.randrange(1, 8)  # an upper-cased character: in the window's text or not
        body = {"prompt": [1], "max_tokens": 40, "stop": [whole[i:i + 2]]}
        answer, events = await _serve(random_rounds(rng, ids, 5), tok, body)
        got, _, reason, used = _streamed(events)
        assert len(got) == used, (seed, got, used)
        caught += not followable(tok) and reason == "stop"
    assert caught >= 5  # the cross-check did catch the window (else this shows nothing)


async def test_an_answer_cut_at_a_stop_string_its_whole_decode_holds_ends_in_stop():
    """The same decoder, answered as JSON first: the text and ids end at the stop string
    the whole decode holds, and finish_reason says "stop" (it was read before the whole
    decode found the stop, and said "length")."""
    caught = 0
    for seed in range(40):
        rng, tok = random.Random(seed), NotLocal()
        ids = [rng.randrange(ord("a"), ord("f")) for _ in range(40)]
        stop = tok.decode(ids)[5 * rng.randrange(1, 8):][:2]
        body = {"prompt": [1], "max_tokens": 40, "stop": [stop]}
        answer, _ = await _serve(random_rounds(rng, ids, 5), tok, body, stream_first=False)
        choice = answer["choices"][0]
        if stop in tok.decode(choice["token_ids"]):
            caught += 1
            assert (choice["finish_reason"], answer["usage"]["completion_tokens"]) == (
                "stop", len(choice["token_ids"])), seed
    assert caught >= 5


class Utf8Bytes:
    """A byte-level decode: one UTF-8 byte an id (ids under 256; others decode to
    nothing, as a special token), U+FFFD for a character whose bytes are not all in."""

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(t for t in ids if t < 256).decode("utf-8", errors="replace")


TEXT = "Le café 東京 😀 ab abc bcd é!é cd"  # characters of 1 to 4 bytes, repeated pairs


def _case(rng: random.Random) -> tuple[list[int], dict, bool]:
    raw = list(TEXT.encode())
    n = rng.randint(1, len(raw))
    start = rng.randrange(len(raw) - n + 1)
    ids = raw[start:start + n] + [300] * rng.randint(0, 2) + raw[:5]
    whole = Utf8Bytes().decode(ids)
    stops = [s for s in (whole[i:i + rng.randint(1, 3)] for i in
                         (rng.randrange(len(whole)) for _ in range(rng.randint(0, 3)))) if s]
    body: dict = {"max_tokens": rng.randint(1, len(ids) + 2)}
    if stops:
        body["stop"] = stops
    if rng.random() < 0.3:
        body["stop_token_ids"] = [rng.choice(ids)]
    chat = rng.random() < 0.3
    if chat:
        body["messages"] = [{"role": "user", "content": [{"type": "token_ids",
                                                          "token_ids": [1]}]}]
    else:
        body["prompt"] = [1]
    return ids, body, chat


def _added_up(events: list, chat: bool) -> tuple[list[int], str, str, int]:
    if not chat:
        return _streamed(events)
    chunks = [e for e in events[:-1] if e["choices"]]
    assert sum("role" in c["choices"][0]["delta"] for c in chunks) == 1  # the first only
    return ([t for c in chunks for t in c["choices"][0]["token_ids"]],
            "".join(c["choices"][0]["delta"].get("content", "") for c in chunks),
            chunks[-1]["choices"][0]["finish_reason"], events[-2]["usage"]["completion_tokens"])


async def test_streams_answers_and_rounds_agree():
    """Stop strings (several; completed by a round's first token, in a character split
    across rounds), a stop id in the same round, max_tokens within a round, chat and
    completions: each stream adds up to its JSON answer (ids, text, finish_reason,
    usage), and rounds of several ids answer as one-id rounds (target-only) do."""
    rng = random.Random(5)
    for _ in range(60):
        ids, body, chat = _case(rng)
        answers = []
        for rounds in (random_rounds(rng, ids, 6), [[t] for t in ids]):
            answer, events = await _serve(rounds, Utf8Bytes(), body, chat=chat)
            c = answer["choices"][0]
            got = (c["token_ids"], c["message"]["content"] if chat else c["text"],
                   c["finish_reason"], answer["usage"]["completion_tokens"])
            assert _added_up(events, chat) == got, (body, rounds)
            answers.append(got)
        assert answers[0] == answers[1], (body, ids)
