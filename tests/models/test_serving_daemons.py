"""Both daemons as real processes on the embedded SmolLM2-135M, over HTTP: text in and
text out, the drafter equal to the target (early exit at all 30 layers) accepting
nearly every draft, seeds reproducing outputs, and a stop id ending a request."""

from __future__ import annotations

import pytest
from daemon_harness import Pair

pytestmark = [pytest.mark.model, pytest.mark.daemons]

PROMPT = "Once upon a time, in a small village by the sea,"


@pytest.fixture(scope="module")
def pair(smol, tmp_path_factory):  # smol: skips when the model or transformers is absent
    from pp1q.models.hf import export_folder

    # the session's loaded model, de-quantized once: each daemon loads it in about a
    # second instead of parsing the GGUF for 20 s or more
    folder = export_folder(smol, tmp_path_factory.mktemp("smollm2"))
    real = ["--model", str(folder), "--draft", "early-exit:30"]
    p = Pair(tmp_path_factory.mktemp("serving"), worker_args=real,
             verifier_args=[*real, "--watchdog-ms", "60000"])  # CPU rows under load
    yield p
    p.close()


def _one(pair, **body):
    return pair.generate_many([{"prompt": PROMPT, "max_tokens": 6, "seed": 5, **body}])[0]


def test_text_in_text_out_and_drafter_equal_to_target_accepts(pair, smol):
    a = _one(pair, top_k=None)
    assert a["finish_reason"] in ("length", "stop") and 1 <= len(a["token_ids"]) <= 6
    assert a["text"] == smol.tokenizer.decode(
        a["token_ids"][:-1] if a["finish_reason"] == "stop" else a["token_ids"],
        skip_special_tokens=True)
    s = a["stats"]
    assert not any(s["fallbacks"].values()), s
    assert s["drafted"] > 0 and s["accepted"] >= s["drafted"] - 1, s  # q ~ p: ~100%


def test_outputs_are_reproducible_from_the_seed(pair):
    for speculative in (True, False):
        body = dict(speculative=speculative, temperature=0.7, top_p=0.9)
        assert _one(pair, **body)["token_ids"] == _one(pair, **body)["token_ids"]


def test_a_stop_id_ends_the_request(pair):
    first = _one(pair, speculative=False)["token_ids"]
    a = _one(pair, speculative=False, stop_token_ids=[first[0]])
    assert (a["token_ids"], a["finish_reason"], a["text"]) == ([first[0]], "stop", "")


def test_openai_chat_with_messages_uses_the_chat_template(pair, smol):
    """/v1/chat/completions with text messages on a real target: the prompt is the
    messages in the tokenizer's chat template (as /v1/generate's ``chat`` renders one
    user message), and the answer is the same tokens /v1/generate gives for it."""
    import json
    import urllib.request

    messages = [{"role": "system", "content": "You answer in one word."},
                {"role": "user", "content": "Name a colour."}]
    body = {"messages": messages, "max_tokens": 4, "seed": 9, "temperature": 0.7,
            "pp1q": {"speculative": False}}
    req = urllib.request.Request(pair.url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        answer = json.loads(r.read())
    want = smol.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                              tokenize=True)
    want = list(want["input_ids"] if hasattr(want, "input_ids") or isinstance(want, dict)
                else want)
    assert answer["usage"]["prompt_tokens"] == len(want)
    native = pair.client()._call("POST", "/v1/generate", {
        "prompt_token_ids": want, "max_tokens": 4, "seed": 9, "temperature": 0.7,
        "speculative": False, "stop_token_ids": []})
    choice = answer["choices"][0]
    assert choice["token_ids"] == native["token_ids"][: len(choice["token_ids"])]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == smol.tokenizer.decode(
        choice["token_ids"], skip_special_tokens=True)


def test_a_request_past_the_models_context_is_refused_before_any_prefill(pair, smol):
    """The checkpoint's max_position_embeddings bounds prompt + max_tokens: one token past
    it is a 422 at once (its prefill would take tens of seconds here), counted."""
    import json
    import urllib.error
    import urllib.request

    context = smol.max_positions
    assert context == smol.model.config.max_position_embeddings == 8192
    body = {"prompt_token_ids": [1] * (context - 5), "max_tokens": 6}
    req = urllib.request.Request(pair.url + "/v1/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=120)
    assert e.value.code == 422
    assert json.loads(e.value.read())["error"]["code"] == "context_length_exceeded"


def test_a_stop_string_ends_the_ids_where_target_only_sampling_does(pair):
    """Through the official client: a stop string completed inside a speculative round
    ends the answer's ids and usage at the token completing it, as target-only sampling
    (one token a step) does; the text ends before it."""
    openai = pytest.importorskip("openai")
    o = openai.OpenAI(base_url=pair.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    model = o.models.list().data[0].id
    body = dict(model=model, prompt=PROMPT, max_tokens=24, seed=5, temperature=0)
    text = o.completions.create(**body).choices[0].text
    stop = text[10:14]  # a stop string inside the greedy answer (" a w" today)
    got = [o.completions.create(**body, stop=[stop], extra_body={"pp1q": {"speculative": s}})
           for s in (True, False)]
    spec, target_only = ((r.choices[0].token_ids, r.usage.completion_tokens,
                          r.choices[0].text, r.choices[0].finish_reason) for r in got)
    assert spec == target_only
    assert spec[2] == text[: text.index(stop)] and spec[3] == "stop"
    assert got[0].pp1q["stats"]["rounds"] > 0  # it did speculate
