"""The target's context bounds a request before it takes a slot: its prompt and
max_tokens must fit in the target's positions; one past it is refused 422
``context_length_exceeded`` (counted) on both APIs, and a request that fits exactly is
served, its last rounds target-only where a round's drafts would pass the context. The
drafter's context (the worker's ``max_context`` at HELLO) bounds only the rounds that
speculate."""

from __future__ import annotations

import json

import msgspec
import pytest
from fake_decider import FakeDecider
from fake_worker import FakeWorker
from http_post import post_json
from link_harness import WAIT_S, linked
from wire_helpers import config
from wire_vectors import LIMITS

from pp1q.core.outcomes import FallbackCause
from pp1q.runtime.metrics import Metrics
from pp1q.runtime.settings import VerifierSettings
from pp1q.verifier.daemon import routes
from pp1q.verifier.scheduler import Scheduler
from pp1q.verifier.server import HttpServer

pytestmark = pytest.mark.daemons  # binds servers on 127.0.0.1

POSITIONS = 40  # the target's context here
DEPTH = 3


async def _post(port: int, path: str, body: dict) -> tuple[int, dict]:
    status, _, answer = await post_json(port, path, body, WAIT_S)
    return status, json.loads(answer)


def _body(prompt_len: int, max_tokens: int, speculative: bool) -> dict:
    return {"prompt_token_ids": [1] * prompt_len, "max_tokens": max_tokens, "temperature": 0,
            "speculative": speculative, "seed": 1}


@pytest.mark.parametrize("speculative", [True, False])
async def test_a_request_past_the_context_is_refused_and_one_that_fits_is_served(speculative):
    metrics, worker = Metrics("verifier"), FakeWorker()
    async with linked(worker, metrics) as link:
        scheduler = Scheduler(link, FakeDecider(), metrics, slots=1, depth=DEPTH,
                              max_positions=POSITIONS)
        http = HttpServer(routes(VerifierSettings(), link, scheduler, config(versions=(2,))))
        try:
            port = await http.start("127.0.0.1", 0)
            assert await link.wait_ready(WAIT_S)
            max_tokens = 5
            fits = POSITIONS - max_tokens  # the longest prompt that fits
            status, answer = await _post(port, "/v1/generate",
                                         _body(fits + 1, max_tokens, speculative))
            assert status == 422, answer
            assert answer["error"]["code"] == "context_length_exceeded"
            assert f"context is {POSITIONS}" in answer["error"]["message"]
            status, answer = await _post(port, "/v1/completions", {
                "prompt": [1] * (fits + 1), "max_tokens": max_tokens, "temperature": 0,
                "pp1q": {"speculative": speculative}})
            # OpenAI answers it 400 (its error code the same), /v1/generate 422
            assert (status, answer["error"]["code"]) == (400, "context_length_exceeded")
            assert metrics.value("pp1q_requests_refused_total",
                                 reason="context_length_exceeded") == 2
            assert metrics.value("pp1q_slots_in_use") == 0
            status, answer = await _post(port, "/v1/generate",
                                         _body(fits, max_tokens, speculative))
            assert status == 200, answer
            assert len(answer["token_ids"]) == max_tokens
            # no round drafted a position past the context: the target reads first_position
            # + depth positions to score one (positions count from 0)
            assert all(s.first_position + s.depth <= POSITIONS for s in worker.steps)
            if speculative:
                assert worker.steps  # rounds ran while their drafts fitted
                assert answer["stats"]["target_only_steps"] > 0  # then the last target-only
        finally:
            await http.close()


async def test_a_target_with_no_context_of_its_own_bounds_nothing_more():
    """The toy (max_positions None): the API's own prompt bound is the only one."""
    metrics = Metrics("verifier")
    async with linked(FakeWorker(), metrics) as link:
        scheduler = Scheduler(link, FakeDecider(), metrics, slots=1, depth=DEPTH)
        http = HttpServer(routes(VerifierSettings(), link, scheduler, config(versions=(2,))))
        try:
            port = await http.start("127.0.0.1", 0)
            assert await link.wait_ready(WAIT_S)
            status, answer = await _post(port, "/v1/generate", _body(POSITIONS * 4, 5, True))
            assert status == 200, answer
        finally:
            await http.close()


async def test_rounds_past_the_drafters_context_run_target_only():
    """A worker that offers a context shorter than the target's (a draft checkpoint's):
    the rounds that fit it speculate, the later ones run target-only, and no STEP asks
    for a draft past it; the request is served whole."""
    metrics = Metrics("verifier")
    worker = FakeWorker(limits=msgspec.structs.replace(LIMITS, max_context=POSITIONS))
    async with linked(worker, metrics) as link:
        scheduler = Scheduler(link, FakeDecider(), metrics, slots=1, depth=DEPTH)
        http = HttpServer(routes(VerifierSettings(), link, scheduler, config(versions=(2,))))
        try:
            port = await http.start("127.0.0.1", 0)
            assert await link.wait_ready(WAIT_S)
            assert link.max_context == POSITIONS  # the smaller offer wins at HELLO
            max_tokens = 12
            status, answer = await _post(port, "/v1/generate",
                                         _body(POSITIONS - 8, max_tokens, True))
            assert status == 200, answer
            assert len(answer["token_ids"]) == max_tokens
            assert worker.steps  # rounds ran while their drafts fitted
            # the worker holds first_position committed tokens and drafts depth more
            assert all(s.first_position + s.depth + 1 <= POSITIONS for s in worker.steps)
            assert answer["stats"]["target_only_steps"] > 0
            # planned target-only rounds, not proposals discarded
            assert sum(metrics.value("pp1q_fallbacks_total", cause=c.value)
                       for c in FallbackCause) == 0
        finally:
            await http.close()
