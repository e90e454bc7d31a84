"""The OpenAI-shaped request layer without a server: decoding, refusals, stops, chunks."""

import json

import pytest

from pp1q.verifier.http import HttpError
from pp1q.verifier.openai_api import IdText, Shape, Stopper, sse
from pp1q.verifier.openai_request import decode_call

MODEL = "toy"


def _call(obj, *, chat=False, tokenizer=None):
    return decode_call(json.dumps(obj).encode(), chat=chat, tokenizer=tokenizer, model_id=MODEL,
                       vocab=100, default_top_k=32, max_support=64)


class CharTokenizer:
    """One token per character (ids = code points below 100), for stop-string tests."""

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_completion_translates_into_a_generate_request():
    c = _call({"model": MODEL, "prompt": [1, 2], "max_tokens": 3, "seed": 9, "temperature": 0,
               "pp1q": {"speculative": False, "draft_top_k": None}})
    r = c.req
    assert (r.prompt, r.max_tokens, r.seed, r.greedy, r.speculative, r.top_k) == (
        [1, 2], 3, 9, True, False, None)
    assert _call({"prompt": [1]}).req.max_tokens == 16  # OpenAI's default
    # OpenAI's seeds are int64: a negative one is its two's complement, a native seed
    assert _call({"prompt": [1], "seed": -1}).req.seed == (1 << 64) - 1
    assert _call({"prompt": [1], "seed": -(1 << 63)}).req.seed == 1 << 63
    assert _call({"prompt": "ab"}, tokenizer=CharTokenizer()).req.prompt == [97, 98]


def test_chat_takes_token_id_parts_without_a_tokenizer():
    c = _call({"messages": [{"role": "system", "content": [{"type": "token_ids",
                                                            "token_ids": [1, 2]}]},
                            {"role": "user", "content": [{"type": "token_ids",
                                                          "token_ids": [3]}]}]}, chat=True)
    assert c.req.prompt == [1, 2, 3] and c.chat


@pytest.mark.parametrize("body, chat, status, code", [
    ({"prompt": "hello"}, False, 400, "needs_tokenizer"),
    ({"messages": [{"role": "user", "content": "hi"}]}, True, 400, "needs_tokenizer"),
    ({"prompt": [1], "stop": "x"}, False, 400, "needs_tokenizer"),
    ({"prompt": [100]}, False, 422, "token_out_of_vocab"),
    ({"prompt": [1], "stop_token_ids": [100]}, False, 422, "token_out_of_vocab"),
    ({"prompt": []}, False, 422, "invalid_field"),
    ({"prompt": [1], "max_tokens": 0}, False, 422, "invalid_field"),
    ({"prompt": [1], "max_tokens": 4097}, False, 422, "invalid_field"),
    ({"prompt": [1], "n": 2}, False, 422, "invalid_field"),
    ({"prompt": [1], "logit_bias": {"1": 5}}, False, 422, "unsupported_field"),
    ({"prompt": [1], "max_tokens": "3"}, False, 422, "invalid_field"),
    ({"prompt": [[1], [2]]}, False, 422, "invalid_field"),
    ({"prompt": [1], "top_p": 1.5}, False, 422, "invalid_field"),
    ({"prompt": [1], "temperature": -0.5}, False, 422, "invalid_field"),
    ({"prompt": [1], "top_k": -2}, False, 422, "invalid_field"),  # only -1 and 0 mean off
    ({"prompt": [1], "model": "gpt-4"}, False, 404, "model_not_found"),
    ({"prompt": [1], "seed": 1 << 64}, False, 422, "invalid_field"),
    ({"prompt": [1], "seed": -(1 << 63) - 1}, False, 422, "invalid_field"),  # past int64
    ({"prompt": [1], "pp1q": {"draft_top_k": 65}}, False, 422, "top_k_too_large"),
    ({"messages": []}, True, 422, "invalid_field"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, True, 422,
     "invalid_field"),
])
def test_bad_requests_get_a_clear_4xx(body, chat, status, code):
    with pytest.raises(HttpError) as e:
        _call(body, chat=chat)
    assert (e.value.status, e.value.code) == (status, code), e.value.message


@pytest.mark.parametrize("body, path", [
    ({"prompt": [1], "pp1q": {"draft_temperature": 0}}, "`$.pp1q.draft_temperature`"),
    ({"prompt": [1], "temperature": 1e-320}, "`$.temperature`"),
    ({"prompt": [1], "temperature": 200}, "`$.temperature`"),
])
def test_a_refusal_names_the_field_as_the_client_sent_it(body, path):
    with pytest.raises(HttpError) as e:
        _call(body)
    assert e.value.code == "invalid_field" and path in e.value.message, e.value.message


def test_stop_token_ends_the_output_before_it():
    s = Stopper(_call({"prompt": [1], "stop_token_ids": [7]}), IdText())
    assert not s.feed([3, 4])
    assert s.feed([5, 7, 8])  # 7 stops; 8, committed in the same round, is dropped
    assert s.ids == [3, 4, 5] and s.full_text() == " 3 4 5"


def test_stop_string_is_never_streamed_then_taken_back():
    tok = CharTokenizer()
    s = Stopper(_call({"prompt": [97], "stop": ["cd"]}, tokenizer=tok), tok)
    deltas = []
    for piece in ("ab", "c", "xc", "de"):
        stopped = s.feed(tok.encode(piece))
        deltas.append(s.delta(final=stopped))
    # each "c" is held back until the next character shows it does not start "cd"
    assert deltas == ["a", "b", "cx", ""]
    assert stopped and s.full_text() == "abcx"


class ByteTokenizer:
    """A byte-level tokenizer's decode: each id its bytes, the whole run decoded as UTF-8
    with U+FFFD for an incomplete character (as GPT-2 style BPE decodes a prefix)."""

    PIECES = {1: b"Le ", 2: b"caf", 3: "é".encode(), 4: b" ",
              5: "東".encode()[:2], 6: "東".encode()[2:], 7: "😀".encode()[:1],
              8: "😀".encode()[1:3], 9: "😀".encode()[3:], 10: b"!"}

    def decode(self, ids):
        return b"".join(self.PIECES[i] for i in ids).decode("utf-8", errors="replace")


@pytest.mark.parametrize("stop", [None, ["zz"]])
def test_a_character_split_across_tokens_is_streamed_whole(stop):
    """A stream of one-token rounds shows no U+FFFD for a character whose bytes are not
    all in yet, and its deltas concatenate to the whole answer's text."""
    tok = ByteTokenizer()
    body = {"prompt": [1]} | ({"stop": stop} if stop else {})
    s = Stopper(_call(body, tokenizer=CharTokenizer()), tok)
    rounds = [[1], [2], [3], [4], [5], [6], [4], [7], [8], [9], [10]]
    deltas = []
    for i, new in enumerate(rounds):
        s.feed(new)
        deltas.append(s.delta(final=i == len(rounds) - 1))
    assert "".join(deltas) == s.full_text() == "Le café 東 😀!"
    assert not any("\ufffd" in d for d in deltas)


def test_chunks_and_events_have_openai_shapes():
    shape = Shape(chat=True, model=MODEL)
    chunk = shape.chunk(" 1", [1])
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"][0]["delta"] == {"role": "assistant", "content": " 1"}
    # the role in the first chunk only, and a last chunk without text has an empty delta
    assert shape.chunk(" 2", [2])["choices"][0]["delta"] == {"content": " 2"}
    assert shape.chunk("", [], "stop")["choices"][0]["delta"] == {}
    assert Shape(chat=True, model=MODEL).chunk("", [], "stop")["choices"][0]["delta"] == {
        "role": "assistant", "content": ""}  # OpenAI's first chunk
    assert sse(chunk).startswith(b"data: {") and sse(chunk).endswith(b"\n\n")
    assert sse("[DONE]") == b"data: [DONE]\n\n"
    assert Shape(chat=False, model=MODEL).chunk("", [])["object"] == "text_completion"


@pytest.mark.parametrize("body, chat", [
    # null is OpenAI's "the default" for each nullable field (openai's client sends
    # ``max_tokens=None`` as null)
    ({"prompt": [1], "max_tokens": None, "temperature": None, "top_p": None, "n": None,
      "stream": None, "stream_options": None, "seed": None, "stop": None, "user": None}, False),
    # OpenAI fields this server does not implement, at the values that change nothing
    ({"prompt": [1], "frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {},
      "best_of": 1, "echo": False, "logprobs": None, "suffix": None}, False),
    ({"messages": [{"role": "user", "content": [{"type": "token_ids", "token_ids": [1]}]}],
      "frequency_penalty": None, "presence_penalty": 0, "logit_bias": None, "logprobs": False,
      "top_logprobs": None, "response_format": {"type": "text"}, "tools": None,
      "tool_choice": "none"}, True),
    ({"prompt": [1], "top_k": None}, False),  # null: off, as absent
    # with no tools, "auto" can call none: OpenAI takes it
    ({"messages": [{"role": "user", "content": [{"type": "token_ids", "token_ids": [1]}]}],
      "tools": [], "tool_choice": "auto", "functions": None, "function_call": "auto"}, True),
    # OpenAI's newer chat fields: those that change nothing, at any value; the others
    # at the values that ask for nothing
    ({"messages": [{"role": "user", "content": [{"type": "token_ids", "token_ids": [1]}]}],
      "user": "u", "safety_identifier": "s", "prompt_cache_key": "k",
      "parallel_tool_calls": True, "metadata": {"k" * 64: "v" * 512},
      "store": False, "service_tier": "auto", "reasoning_effort": "none",
      "verbosity": "medium", "modalities": ["text"], "audio": None, "prediction": None,
      "web_search_options": None, "moderation": None, "prompt_cache_retention": None,
      "prompt_cache_options": None, "functions": [], "function_call": "none"}, True),
    ({"messages": [{"role": "user", "content": [{"type": "token_ids", "token_ids": [1]}]}],
      "service_tier": "default", "store": None, "metadata": {str(i): "" for i in range(16)},
      "parallel_tool_calls": False}, True),
])
def test_defaults_and_neutral_values_are_accepted(body, chat):
    c = _call(body, chat=chat)
    # a completion's default max_tokens is 16; a chat's is open (the context bounds it)
    assert (c.req.max_tokens, c.open_max) == ((4096, True) if chat else (16, False))
    assert not c.req.greedy and not c.body.stream
    assert c.req.processors == _call({"prompt": [1]}).req.processors


@pytest.mark.parametrize("body, chat, param", [
    ({"prompt": [1], "frequency_penalty": 0.5}, False, "frequency_penalty"),
    ({"prompt": [1], "presence_penalty": -1}, False, "presence_penalty"),
    ({"prompt": [1], "logit_bias": {"3": 100}}, False, "logit_bias"),
    ({"prompt": [1], "best_of": 2}, False, "best_of"),
    ({"prompt": [1], "echo": True}, False, "echo"),
    ({"prompt": [1], "logprobs": 0}, False, "logprobs"),  # 0: the sampled token's logprob
    ({"prompt": [1], "suffix": "x"}, False, "suffix"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, True, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, True, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_object"}}, True, "response_format"),
    ({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}]}, True, "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, True,
     "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}],
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, True, "tool_choice"),
    # OpenAI's newer chat fields, asking for what this server does not do
    *(({"messages": [{"role": "user", "content": "x"}], name: value}, True, name)
      for name, value in [
          ("store", True), ("service_tier", "priority"), ("service_tier", "flex"),
          ("reasoning_effort", "low"), ("verbosity", "high"), ("modalities", ["text", "audio"]),
          ("audio", {"voice": "alloy", "format": "mp3"}),
          ("prediction", {"type": "content", "content": "x"}), ("web_search_options", {}),
          ("moderation", {}), ("prompt_cache_retention", "24h"),
          ("prompt_cache_options", {"ttl": "1h"}), ("functions", [{"name": "f"}]),
          ("function_call", {"name": "f"})]),
    ({"messages": [{"role": "user", "content": "x"}], "stream": True,
      "stream_options": {"include_obfuscation": True}}, True,
     "stream_options.include_obfuscation"),
    ({"prompt": [1], "stream": True, "stream_options": {"include_obfuscation": True}}, False,
     "stream_options.include_obfuscation"),
])
def test_unimplemented_fields_that_would_change_the_answer_are_refused(body, chat, param):
    with pytest.raises(HttpError) as e:
        _call(body, chat=chat, tokenizer=CharTokenizer())
    assert (e.value.status, e.value.code, e.value.param) == (422, "unsupported_field", param)
    assert f"`{param}`" in e.value.message


@pytest.mark.parametrize("stream_options", [
    {"include_usage": None}, {"include_usage": True, "include_obfuscation": False},
    {"include_usage": False, "include_obfuscation": None}, {}])
def test_stream_options_take_null_and_false_as_their_default(stream_options):
    body = {"prompt": [1], "stream": True, "stream_options": stream_options}
    assert _call(body).body.stream_options.include_usage in (None, False, True)
    assert bool(_call(body).body.stream_options.include_usage) == bool(
        stream_options.get("include_usage"))


@pytest.mark.parametrize("metadata, why", [
    ({str(i): "v" for i in range(17)}, "`object` of length <= 16"),  # OpenAI's 16 pairs
    ({"k" * 65: "v"}, "`str` of length <= 64"),  # keys: OpenAI's 64 characters at most
    ({"k": "v" * 513}, "`str` of length <= 512"),  # values: OpenAI's 512 at most
    ({"k": 1}, "Expected `str`, got `int`"),  # strings only, as OpenAI's
    (["k", "v"], "got `array`")])
def test_metadata_is_bounded_as_openais(metadata, why):
    chat = {"messages": [{"role": "user", "content": [{"type": "token_ids", "token_ids": [1]}]}]}
    with pytest.raises(HttpError) as e:
        _call({**chat, "metadata": metadata}, chat=True)
    assert (e.value.status, e.value.code) == (422, "invalid_field")
    assert why in e.value.message and e.value.param.startswith("metadata"), e.value.message


def test_top_k_null_is_off_and_a_value_still_truncates():
    off = _call({"prompt": [1]}).req.processors
    assert _call({"prompt": [1], "top_k": None}).req.processors == off
    assert _call({"prompt": [1], "top_k": 5}).req.processors != off


def test_max_completion_tokens_is_chats_max_tokens():
    chat = {"messages": [{"role": "user", "content": [{"type": "token_ids", "token_ids": [1]}]}]}
    assert _call({**chat, "max_completion_tokens": 5}, chat=True).req.max_tokens == 5
    assert _call({**chat, "max_completion_tokens": 5, "max_tokens": 5},
                 chat=True).req.max_tokens == 5
    with pytest.raises(HttpError) as e:  # two different bounds: which one was meant?
        _call({**chat, "max_completion_tokens": 5, "max_tokens": 6}, chat=True)
    assert (e.value.status, e.value.param) == (422, "max_completion_tokens")
    with pytest.raises(HttpError) as e:  # a chat field only
        _call({"prompt": [1], "max_completion_tokens": 5})
    assert e.value.param == "max_completion_tokens"


@pytest.mark.parametrize("body, param", [
    ({"prompt": [1], "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1], "pp1q": {"nope": 1}}, "pp1q.nope"),
    ({"prompt": [1], "whatever": 1}, "whatever"),
    ({}, "prompt"),
    ({"prompt": [1], "model": "gpt-4"}, "model"),
    ({"prompt": [1], "pp1q": {"draft_temperature": 0}}, "pp1q.draft_temperature"),
    # the checks decode_generate makes past msgspec's name their field too
    ({"prompt": [100]}, "prompt"),
    ({"messages": [{"role": "user", "content": [{"type": "token_ids", "token_ids": [100]}]}]},
     "messages"),
    ({"prompt": [1], "stop_token_ids": [100]}, "stop_token_ids"),
    ({"prompt": [1], "pp1q": {"draft_top_k": 65}}, "pp1q.draft_top_k"),
    ({"messages": [{"role": "user", "content": []}]}, "messages"),  # no ids in them
])
def test_a_refusal_names_its_param(body, param):
    with pytest.raises(HttpError) as e:
        _call(body, chat="messages" in body)
    assert e.value.param == param, e.value.message


def test_error_bodies_have_openais_shape():
    from pp1q.verifier.http import error_body

    e = HttpError(422, "invalid_field", "Expected `int` >= 1 - at `$.max_tokens`")
    assert error_body(e) == {"error": {"message": e.message, "type": "invalid_request_error",
                                       "param": "max_tokens", "code": "invalid_field"}}
    assert error_body(HttpError(503, "busy", "queue full"))["error"]["type"] == "server_error"


def test_an_open_chat_takes_what_the_context_leaves():
    from pp1q.verifier.openai_request import fit_open_max

    chat = {"messages": [{"role": "user", "content": [{"type": "token_ids",
                                                       "token_ids": [1, 2, 3]}]}]}
    for max_positions, want in [(None, 4096), (10_000, 4096), (100, 97), (3, 1)]:
        c = _call(chat, chat=True)
        fit_open_max(c, max_positions)
        assert c.req.max_tokens == want
    c = _call({**chat, "max_tokens": 50}, chat=True)  # a bound the client gave stays
    fit_open_max(c, 20)
    assert c.req.max_tokens == 50


def test_a_stop_string_ends_the_ids_at_the_token_completing_it():
    """A round commits several tokens; the ids after the one that completed a stop
    string are dropped, as target-only sampling would have stopped there: the answer's
    token_ids and usage do not depend on where the rounds fell."""
    tok = CharTokenizer()
    call = _call({"prompt": [97], "stop": ["bc"]}, tokenizer=tok)
    for rounds in ([tok.encode("abcde")], [tok.encode("a"), tok.encode("bcd")],
                   [tok.encode(c) for c in "abcde"]):
        s = Stopper(call, tok)
        for new in rounds:
            if s.feed(new):
                break
        assert (s.ids, s.full_text()) == (tok.encode("abc"), "a")
        shape = Shape(chat=False, model=MODEL)
        answer = {"finish_reason": "length", "seed": 1, "stats": {}, "elapsed_s": 0.0}
        assert shape.answer(call, s, answer)["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("chat", [False, True])
def test_every_field_of_the_official_client_is_known(chat):
    """Each field the official client's create() sends is decoded (taken or refused by
    name), none refused as unknown: a client written for OpenAI may send any of them."""
    import inspect

    from pp1q.verifier.openai_request import ChatBody, CompletionBody, StreamOptions

    openai = pytest.importorskip("openai")
    resources = openai.resources
    create = (resources.chat.completions.Completions if chat
              else resources.completions.Completions).create
    sent = set(inspect.signature(create).parameters) - {
        "self", "extra_headers", "extra_query", "extra_body", "timeout"}
    known = set((ChatBody if chat else CompletionBody).__struct_fields__)
    assert sent - known == set()
    options = openai.types.chat.ChatCompletionStreamOptionsParam.__annotations__
    assert set(options) - set(StreamOptions.__struct_fields__) == set()


def test_a_chat_templates_refusal_names_the_messages():
    class Refusing(CharTokenizer):
        def apply_chat_template(self, messages):
            raise ValueError("Conversation roles must alternate user/assistant")

    with pytest.raises(HttpError) as e:
        _call({"messages": [{"role": "user", "content": "x"}]}, chat=True, tokenizer=Refusing())
    assert (e.value.code, e.value.param) == ("invalid_field", "messages"), e.value.message
