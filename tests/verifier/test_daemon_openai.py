"""The OpenAI-shaped API on real daemons: the official ``openai`` client, streaming,
``pp1q generate``, 200 concurrent clients, and a client that leaves mid-stream."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time

import pytest
from daemon_harness import Pair, value

from pp1q.runtime.launcher import pp1q_command

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

openai = pytest.importorskip("openai")  # the test extra

PROMPT = [3, 7]
POLL = 400  # bounded polls of 50 ms: far above what the daemons need here


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    # a 2 ms forward pass, as a real target has: rounds interleave with the handlers' writes
    # (an instant toy target commits a whole request before its stream is written once)
    p = Pair(tmp_path_factory.mktemp("openai"), preset="close",
             verifier_args=["--target-delay-ms", "2"])
    yield p
    p.close()


def _client(pair) -> openai.OpenAI:
    return openai.OpenAI(base_url=pair.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


def test_openai_client_completion_chat_and_stream(pair):
    o = _client(pair)
    model = o.models.list().data[0].id
    assert model == pair.client().health()["target"]
    # a target-only completion is a pure function of (prompt, seed): /v1/generate agrees
    native = pair.client().generate(PROMPT, 6, seed=11, speculative=False)["token_ids"]
    r = o.completions.create(model=model, prompt=PROMPT, max_tokens=6, seed=11,
                             extra_body={"pp1q": {"speculative": False}})
    choice = r.choices[0]
    assert choice.token_ids == native and choice.finish_reason == "length"
    assert choice.text == "".join(f" {t}" for t in native)  # the toy's text of ids
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (2, 6)
    assert r.pp1q["stats"]["target_only_steps"] == 6 and r.pp1q["seed"] == 11
    # speculative: the extension field carries the acceptance statistics
    r = o.completions.create(model=model, prompt=PROMPT, max_tokens=12, seed=5)
    stats = r.pp1q["stats"]
    assert stats["rounds"] > 0 and len(r.choices[0].token_ids) == 12
    assert stats["accepted"] + stats["rounds"] + stats["target_only_steps"] >= 12
    # chat on a target without a tokenizer: token-id content parts (pp1q extension)
    r = o.chat.completions.create(model=model, max_tokens=4, seed=3, messages=[
        {"role": "user", "content": [{"type": "token_ids", "token_ids": PROMPT}]}],
        extra_body={"pp1q": {"speculative": False}})
    assert r.choices[0].token_ids == pair.client().generate(
        PROMPT, 4, seed=3, speculative=False)["token_ids"]
    assert r.choices[0].message.role == "assistant" and r.object == "chat.completion"
    # streamed: one chunk per committed round (target-only: one token each), then usage
    chunks = list(o.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, seed=11, stream=True,
        stream_options={"include_usage": True}, extra_body={"pp1q": {"speculative": False}}))
    ids = [t for c in chunks if c.choices for t in c.choices[0].token_ids]
    assert ids == native
    assert sum(1 for c in chunks if c.choices and c.choices[0].token_ids) == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6


def test_stop_token_ids_end_the_output(pair):
    full = pair.client().generate(PROMPT, 16, seed=21, speculative=False)["token_ids"]
    stop = full[5]
    want = full[: full.index(stop)]
    for stream in (False, True):
        o = _client(pair)
        r = o.completions.create(prompt=PROMPT, max_tokens=16, seed=21, stream=stream,
                                 model=None or o.models.list().data[0].id,
                                 extra_body={"stop_token_ids": [stop],
                                             "pp1q": {"speculative": False}})
        if stream:
            chunks = list(r)
            got = [t for c in chunks for t in c.choices[0].token_ids]
            finish = chunks[-1].choices[0].finish_reason
        else:
            got, finish = r.choices[0].token_ids, r.choices[0].finish_reason
        assert (got, finish) == (want, "stop")


def test_errors_reach_the_openai_client_as_4xx(pair):
    o = _client(pair)
    with pytest.raises(openai.BadRequestError, match="tokenizer"):
        o.completions.create(model=o.models.list().data[0].id, prompt="hello", max_tokens=2)
    # a field refused: OpenAI's and vLLM's 400 (/v1/generate answers 422), so a client
    # written against OpenAI catches it as BadRequestError
    with pytest.raises(openai.BadRequestError) as e:
        o.completions.create(model=o.models.list().data[0].id, prompt=[10_000], max_tokens=2)
    assert e.value.code == "token_out_of_vocab"
    with pytest.raises(openai.NotFoundError):
        o.completions.create(model="not-this-one", prompt=PROMPT, max_tokens=2)


def test_pp1q_generate_streams_and_names_the_url(pair):
    native = pair.client().generate(PROMPT, 8, seed=4, speculative=False)["token_ids"]
    proc = subprocess.run(pp1q_command("generate", "--url", pair.url, "--prompt", "3,7",
                                       "--max-tokens", "8", "--seed", "4", "--target-only",
                                       "--json"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    per_event = [e["choices"][0]["token_ids"] for e in events]
    assert [t for ids in per_event for t in ids] == native
    assert sum(1 for ids in per_event if ids) == 8  # one event per committed token
    proc = subprocess.run(pp1q_command("generate", "--url", pair.url, "--prompt", "3,7",
                                       "--max-tokens", "8", "--seed", "4", "--target-only"),
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == [str(t) for t in native]
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    proc = subprocess.run(pp1q_command("generate", "--url", dead, "--prompt", "1"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and dead in proc.stderr
    proc = subprocess.run(pp1q_command("generate", "--url", pair.url, "--prompt", "99999"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and pair.url in proc.stderr and "token_out_of_vocab" in proc.stderr


def test_200_concurrent_clients(pair):
    import aiohttp

    async def main() -> list[int]:
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as session:
            async def one(i: int) -> int:
                async with session.post(pair.url + "/v1/completions", json={
                        "prompt": PROMPT, "max_tokens": 4, "seed": i}) as resp:
                    body = await resp.json()
                    assert len(body["choices"][0]["token_ids"]) == 4
                    return resp.status
            return await asyncio.gather(*(one(i) for i in range(200)))

    assert asyncio.run(main()) == [200] * 200


def test_a_client_that_leaves_frees_its_slot_within_a_round(tmp_path):
    pair = Pair(tmp_path, preset="close", verifier_args=["--slots", "1",
                                                         "--target-delay-ms", "20"])
    try:
        before = pair.metrics("verifier")
        sock = socket.create_connection(("127.0.0.1", int(pair.url.rsplit(":", 1)[1])))
        body = json.dumps({"prompt": PROMPT, "max_tokens": 4096, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        seen = b""
        for _ in range(100):  # until the first chunk of tokens
            seen += sock.recv(4096)
            if b'"token_ids":[' in seen:
                break
        sock.close()  # gone mid-request
        for _ in range(POLL):
            m = pair.metrics("verifier")
            if value(m, "pp1q_slots_in_use") == 0:
                break
            time.sleep(0.05)
        assert value(m, "pp1q_slots_in_use") == 0
        assert value(m, "pp1q_requests_total", outcome="error") - value(
            before, "pp1q_requests_total", outcome="error") == 1
        made = value(m, "pp1q_generated_tokens_total")
        assert made < 200  # a few rounds of 20 ms, not the 4096 asked for
        # the only slot serves the next request
        assert len(pair.client().generate(PROMPT, 3)["token_ids"]) == 3
    finally:
        pair.close()


def test_the_clients_chat_stream_helper_gets_the_role_once(pair):
    """openai's ``chat.completions.stream`` accumulates each delta's strings: a role in
    every chunk came out as "assistantassistant..." (OpenAI sends it in the first only)."""
    o = _client(pair)
    model = o.models.list().data[0].id
    msgs = [{"role": "user", "content": [{"type": "token_ids", "token_ids": PROMPT}]}]
    opts = {"pp1q": {"speculative": False}}
    full = o.chat.completions.create(model=model, max_tokens=16, seed=5, messages=msgs,
                                     extra_body=opts).choices[0].token_ids
    stop = full[5]
    with o.chat.completions.stream(model=model, max_tokens=16, seed=5, messages=msgs,
                                   extra_body={**opts, "stop_token_ids": [stop]}) as s:
        roles = [e.chunk.choices[0].delta.role for e in s if e.type == "chunk"]
        final = s.get_final_completion().choices[0]
    assert roles[0] == "assistant" and set(roles[1:]) <= {None}
    assert final.message.role == "assistant" and final.finish_reason == "stop"
    assert final.message.content == "".join(f" {t}" for t in full[: full.index(stop)])


def test_the_clients_nulls_defaults_and_refusals(pair):
    """What the official client sends: None as null (the field's default), OpenAI's
    fields we do not implement at their defaults (taken) or otherwise (a 400 naming the
    field in OpenAI's error object), max_completion_tokens, stream_options alone."""
    o = _client(pair)
    model = o.models.list().data[0].id
    r = o.completions.create(model=model, prompt=PROMPT, max_tokens=None, temperature=None,
                             top_p=None, n=None, seed=2, presence_penalty=0,
                             frequency_penalty=0, logit_bias={}, echo=False, best_of=1)
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"
    msgs = [{"role": "user", "content": [{"type": "token_ids", "token_ids": PROMPT}]}]
    r = o.chat.completions.create(model=model, messages=msgs, max_completion_tokens=3,
                                  logprobs=False, response_format={"type": "text"})
    assert r.usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError) as e:
        o.completions.create(model=model, prompt=PROMPT, max_tokens=2, logit_bias={"3": 50})
    assert (e.value.param, e.value.type, e.value.code) == (
        "logit_bias", "invalid_request_error", "unsupported_field")
    with pytest.raises(openai.BadRequestError) as e:
        o.chat.completions.create(model=model, messages=msgs, max_tokens=2, logprobs=True)
    assert e.value.param == "logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        o.completions.create(model=model, prompt=PROMPT, max_tokens=2,
                             stream_options={"include_usage": True})
    assert e.value.param == "stream_options"
    with pytest.raises(openai.NotFoundError) as e:
        o.completions.create(model="not-this-one", prompt=PROMPT, max_tokens=2)
    assert (e.value.param, e.value.code) == ("model", "model_not_found")


def test_the_clients_newer_chat_fields(pair):
    """OpenAI's newer chat fields as the official client sends them: those that change no
    answer taken at any value, the others at their neutral values (a 400 naming the
    field otherwise); null top_k and include_usage are their defaults; tool_choice
    "auto" with no tools calls none."""
    o = _client(pair)
    model = o.models.list().data[0].id
    msgs = [{"role": "user", "content": [{"type": "token_ids", "token_ids": PROMPT}]}]
    r = o.chat.completions.create(
        model=model, messages=msgs, max_completion_tokens=3, seed=6, store=False,
        metadata={"run": "pp1q"}, parallel_tool_calls=False, service_tier="auto",
        reasoning_effort="none", verbosity="medium", modalities=["text"], user="u",
        prompt_cache_key="k", safety_identifier="s", tool_choice="auto",
        extra_body={"top_k": None, "pp1q": {"speculative": False}})
    want = pair.client().generate(PROMPT, 3, seed=6, speculative=False)["token_ids"]
    assert r.choices[0].token_ids == want
    chunks = list(o.chat.completions.create(
        model=model, messages=msgs, max_tokens=3, seed=6, stream=True, tool_choice="none",
        stream_options={"include_usage": None, "include_obfuscation": False},
        extra_body={"pp1q": {"speculative": False}}))
    assert [t for c in chunks for t in c.choices[0].token_ids] == want  # no usage chunk
    for fields, param in [({"store": True}, "store"), ({"service_tier": "priority"},
                                                       "service_tier"),
                          ({"stream": True, "stream_options": {"include_obfuscation": True}},
                           "stream_options.include_obfuscation")]:
        with pytest.raises(openai.BadRequestError) as e:
            o.chat.completions.create(model=model, messages=msgs, max_tokens=2, **fields)
        assert (e.value.param, e.value.code) == (param, "unsupported_field")


def test_the_client_retrieves_the_model(pair):
    o = _client(pair)
    listed = o.models.list().data[0]
    got = o.models.retrieve(listed.id)
    assert (got.id, got.object, got.owned_by, got.created) == (
        listed.id, "model", listed.owned_by, listed.created)
    with pytest.raises(openai.NotFoundError) as e:
        o.models.retrieve("org/not-this-one")
    assert e.value.code == "model_not_found"
