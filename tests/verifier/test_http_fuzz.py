"""The verifier's HTTP API fuzzed as hostile and careless clients use it, on real toy
daemons: bodies drawn from each route's JSON Schema (``msgspec.json.schema`` of its
Struct, tests/support/schema_strategy.py), then mutated (wrong types, unknown and
missing fields, huge numbers) or broken as bytes (NaN literals, invalid UTF-8,
duplicate keys, deep nesting, truncated, empty and oversized bodies), sent with wrong
content types and methods, chunked or gzip-encoded, several at once, and streams the
client abandons mid-way (FIN or RST).

The invariant (docs/operations.md, "HTTP API"): every request gets a documented answer
(tests/support/http_probe.py: 2xx of the route's shape, a 4xx with the JSON error
body, 503 ``busy``) in its bounds; afterwards the verifier is alive, logged no error,
holds no slot, its memory within bounds, and still speculates (two abandoned streams
once wedged every speculative request). The default run is bounded (~20 s); the
``slow`` variant draws far more examples (--runslow).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import msgspec
import pytest
from daemon_harness import Pair, value
from http_probe import Exchange, abandon, check
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_strategy import from_schema, mutated, raw_edit

from pp1q.verifier.api import GenerateBody
from pp1q.verifier.openai_request import ChatBody, CompletionBody

pytestmark = pytest.mark.daemons  # starts real daemon processes

VOCAB = 16  # the Pair's toy vocabulary
MAX_TOKENS = 8  # the drawn requests' own bound: each runs a few rounds, milliseconds
ABANDONED_TOKENS = 4096  # an abandoned stream is mid-round when its client leaves
FIRST_EVENT_BYTES = 400  # an SSE answer's head and first event: the request is running
AT_ONCE = 4  # requests of one example sent concurrently
MEMORY_SLACK_MIB = 128  # the verifier's growth over a run: a few bodies of 1 MiB at once
SETTLE_POLLS = 400  # bounded polls of 50 ms for the slots to come back
ROUTES = {"/v1/generate": GenerateBody, "/v1/completions": CompletionBody,
          "/v1/chat/completions": ChatBody}
OTHER_PATHS = ["/healthz", "/v1/models", "/v1/nope", "/"]
CONTENT_TYPES = ["application/json", None, "text/plain", "application/x-www-form-urlencoded",
                 "application/json; charset=latin-1", "multipart/form-data; boundary=x"]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    p = Pair(tmp_path_factory.mktemp("http_fuzz"), vocab=VOCAB, preset="close")
    yield p
    p.close()


def _bodies(path: str) -> st.SearchStrategy:
    return from_schema(msgspec.json.schema(ROUTES[path]),
                       caps={"max_tokens": MAX_TOKENS, "max_completion_tokens": MAX_TOKENS})


@st.composite
def exchanges(draw) -> Exchange:
    path = draw(st.sampled_from([*ROUTES, *OTHER_PATHS]))
    body = draw(_bodies(path)) if path in ROUTES else {}
    hostile = draw(st.sampled_from(["none", "mutated", "raw"]))
    if hostile == "mutated":
        body = draw(mutated(body))
    data = json.dumps(body).encode()
    if hostile == "raw":
        data = draw(raw_edit(data))
    usual = "POST" if path in ROUTES else "GET"
    method = draw(st.sampled_from([usual] * 4 + METHODS))
    return Exchange(method, path, data, draw(st.sampled_from(CONTENT_TYPES)),
                    chunked=draw(st.booleans()), chunk=draw(st.integers(1, 64)),
                    gzip=draw(st.sampled_from([None, None, "ok", "trailing", "not_gzip"])))


@st.composite
def abandoned(draw) -> tuple:
    """A stream whose client leaves after its first events (mid-request, a STEP likely in
    flight): with a FIN or an RST."""
    prompt = [1, 2]
    if draw(st.booleans()):
        path, body = "/v1/completions", {"prompt": prompt}
    else:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "token_ids", "token_ids": prompt}]}]}
    body |= {"max_tokens": ABANDONED_TOKENS, "stream": True}
    return ("abandon", path, json.dumps(body).encode(),
            draw(st.integers(FIRST_EVENT_BYTES, 4000)), draw(st.booleans()))


def _run(pair: Pair, action) -> None:
    if isinstance(action, Exchange):
        check(action, action.send(pair.verifier.port), VOCAB)
    else:
        _, path, body, take, reset = action
        abandon(pair.verifier.port, path, body, take, reset)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _fuzz(pair: Pair, examples: int) -> None:
    pool = cf.ThreadPoolExecutor(AT_ONCE)
    pid = pair.verifier.proc.pid
    pair.client().generate([1, 2], MAX_TOKENS, seed=1)  # warm: first-use allocations done
    rss0 = _rss_mib(pid)

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(st.one_of(exchanges(), exchanges(), exchanges(), abandoned()),
                    min_size=1, max_size=AT_ONCE))
    def run(actions):
        for done in [pool.submit(_run, pair, a) for a in actions]:
            done.result()  # each answer checked; an AssertionError fails the example

    try:
        run()
    finally:
        pool.shutdown(wait=True)
    _settled(pair)
    assert _rss_mib(pid) - rss0 < MEMORY_SLACK_MIB


def _settled(pair: Pair) -> None:
    """Alive, no slot held, no error logged, and still speculating."""
    assert pair.verifier.alive() and pair.worker.alive()
    for _ in range(SETTLE_POLLS):
        m = pair.metrics("verifier")
        if value(m, "pp1q_slots_in_use") == 0 and value(m, "pp1q_requests_queued") == 0:
            break
        time.sleep(0.05)
    assert value(m, "pp1q_slots_in_use") == 0, "a slot stayed held"
    answer = pair.client().generate([1, 2], MAX_TOKENS, seed=2)
    assert answer["stats"]["rounds"] > 0, answer  # the worker still drafts for it
    log = (pair.tmp / "verifier.log").read_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-4000:]


def test_hostile_clients_get_documented_answers(pair):
    _fuzz(pair, examples=40)


@pytest.mark.slow
def test_hostile_clients_get_documented_answers_long(pair):
    _fuzz(pair, examples=10_000)
