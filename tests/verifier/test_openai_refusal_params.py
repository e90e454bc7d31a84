"""The OpenAI routes name the field behind the daemon's own refusals of a decoded request
(its ``check``: the context, greedy-only speculation, a vocabulary-sharded group's
top-k), as OpenAI's error objects do (``messages`` for a chat past the context); the
official client reads it as ``BadRequestError.param``. /v1/generate shares the check and
keeps its answer: 422, param null."""

from __future__ import annotations

import contextlib
import json

import msgspec
import pytest
from fake_decider import FakeDecider
from fake_worker import FakeWorker
from http_post import post_json
from link_harness import WAIT_S, linked
from wire_helpers import config
from wire_vectors import IDENTITY

from pp1q.runtime.metrics import Metrics
from pp1q.runtime.settings import VerifierSettings
from pp1q.verifier.daemon import routes
from pp1q.verifier.scheduler import Scheduler
from pp1q.verifier.server import HttpServer
from pp1q.wire.limits import Limits

pytestmark = pytest.mark.daemons  # binds servers on 127.0.0.1

openai = pytest.importorskip("openai")  # the test extra

POSITIONS = 40  # the target's context here
VOCAB = 2048  # above a sharded group's top-k bound (MAX_SHARD_TOP_K 1024)
GREEDY = VerifierSettings(speculation="greedy")
SAMPLED = VerifierSettings(speculation="sampled")
SHARDED = VerifierSettings(speculation="sampled", ranks=2, shard_vocab=True)


@contextlib.asynccontextmanager
async def serving(settings: VerifierSettings):
    """An HTTP server on the daemon's routes (a group of ``settings.ranks`` ranks, a
    target of POSITIONS positions and VOCAB ids): its port."""
    metrics = Metrics("verifier")
    async with linked(FakeWorker(), metrics) as link:
        scheduler = Scheduler(link, FakeDecider(), metrics, slots=1, depth=3,
                              max_positions=POSITIONS)
        wire = config(versions=(2,), identity=msgspec.structs.replace(IDENTITY, vocab=VOCAB),
                      limits=Limits.make(vocab=VOCAB))
        http = HttpServer(routes(settings, link, scheduler, wire, world=settings.ranks))
        try:
            yield await http.start("127.0.0.1", 0)
        finally:
            await http.close()


def _ids(n: int) -> dict:
    return {"type": "token_ids", "token_ids": [1] * n}


# (settings, the OpenAI body's fields, the same request's native fields, code, param)
CASES = {
    "context_completion": (SAMPLED, {"prompt": [1] * POSITIONS, "max_tokens": 5},
                           {}, "context_length_exceeded", "prompt"),
    "context_chat": (SAMPLED, {"messages": [{"role": "user", "content": [_ids(POSITIONS)]}],
                               "max_tokens": 5}, {}, "context_length_exceeded", "messages"),
    "sampled_on_v1": (GREEDY, {"prompt": [1], "max_tokens": 2, "temperature": 0.7},
                      {"temperature": 0.7}, "sampled_on_v1", "temperature"),
    "sampled_on_v1_chat": (GREEDY, {"messages": [{"role": "user", "content": [_ids(1)]}],
                                    "max_tokens": 2, "temperature": 0.7},
                           {"temperature": 0.7}, "sampled_on_v1", "temperature"),
    "sharded_top_k": (SHARDED, {"prompt": [1], "max_tokens": 2, "top_k": 1025},
                      {"target_top_k": 1025}, "unsupported_processors", "top_k"),
}


@pytest.mark.parametrize("case", CASES)
async def test_the_client_reads_the_field_behind_the_daemons_refusal(case):
    settings, body, native, code, param = CASES[case]
    async with serving(settings) as port:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                                    max_retries=0, timeout=WAIT_S)
        chat = "messages" in body
        create = client.chat.completions.create if chat else client.completions.create
        fields = {k: v for k, v in body.items() if k != "top_k"}
        try:
            with pytest.raises(openai.BadRequestError) as e:
                await create(model=None, **fields,
                             extra_body={k: v for k, v in body.items() if k == "top_k"})
        finally:
            await client.close()
        assert (e.value.code, e.value.param) == (code, param), e.value.message
        # /v1/generate: the same refusal, unchanged (422, no param)
        prompt = [1] * (POSITIONS if case.startswith("context") else 1)
        status, _, raw = await post_json(port, "/v1/generate", {
            "prompt_token_ids": prompt, "max_tokens": body["max_tokens"], **native}, WAIT_S)
        error = json.loads(raw)["error"]
        assert (status, error["code"], error["param"]) == (422, code, None)
