"""TextCodec's chat hook on the OpenAI chat route, without a model: the messages go to
the tokenizer's chat template with the assistant's turn opener; a tokenizer without a
template, or a template that refuses the messages, is a 422, never a server error."""

from __future__ import annotations

import json

import pytest

from pp1q.models.text import TextCodec
from pp1q.verifier.http import HttpError
from pp1q.verifier.openai_request import decode_call

jinja2 = pytest.importorskip("jinja2")  # transformers renders chat templates with it


class TemplateTokenizer:
    """A tokenizer shaped like transformers' for what TextCodec uses: ids are code
    points; the template writes ``role:content|`` per message, ``>`` to open a turn."""

    eos_token_id = 0

    def __init__(self, chat_template: str | None = "x", refuse: bool = False) -> None:
        self.chat_template, self.refuse = chat_template, refuse
        self.seen: list = []

    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        self.seen.append((messages, add_generation_prompt, tokenize))
        if self.refuse:
            raise jinja2.TemplateError("Conversation roles must alternate")
        text = "".join(f"{m['role']}:{m['content']}|" for m in messages)
        return [ord(c) for c in text + (">" if add_generation_prompt else "")]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


MESSAGES = [{"role": "system", "content": "be"}, {"role": "user", "content": "hi"}]


def _chat(tokenizer):
    return decode_call(json.dumps({"messages": MESSAGES, "max_tokens": 2}).encode(), chat=True,
                       tokenizer=TextCodec(tokenizer), model_id="m", vocab=200,
                       default_top_k=None, max_support=64)


def test_chat_messages_go_through_the_chat_template():
    tok = TemplateTokenizer()
    call = _chat(tok)
    assert call.req.prompt == [ord(c) for c in "system:be|user:hi|>"]
    assert tok.seen == [(MESSAGES, True, True)]


def test_a_tokenizer_without_a_chat_template_is_refused():
    with pytest.raises(HttpError) as e:
        _chat(TemplateTokenizer(chat_template=None))
    assert (e.value.status, e.value.code) == (422, "no_chat_template")


def test_a_template_refusing_the_messages_is_a_422():
    with pytest.raises(HttpError) as e:
        _chat(TemplateTokenizer(refuse=True))
    assert (e.value.status, e.value.code) == (422, "invalid_field")
    assert "roles must alternate" in str(e.value)


def test_text_content_parts_and_names_reach_the_template():
    """OpenAI's content may be a list of text parts (what many clients send): their texts,
    joined by newlines (as vLLM joins them), are the message's content; a message's
    ``name`` goes to the template with it."""
    tok = TemplateTokenizer()
    body = {"max_tokens": 2, "messages": [
        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"},
                                                    {"type": "text", "text": "b"}]}]}
    decode_call(json.dumps(body).encode(), chat=True, tokenizer=TextCodec(tok), model_id="m",
                vocab=200, default_top_k=None, max_support=64)
    assert tok.seen[0][0] == [{"role": "user", "content": "a\nb", "name": "ann"}]
    body["messages"][0]["content"].append({"type": "token_ids", "token_ids": [1]})
    with pytest.raises(HttpError) as e:  # ids in a text target's chat: which text are they?
        decode_call(json.dumps(body).encode(), chat=True, tokenizer=TextCodec(tok),
                    model_id="m", vocab=200, default_top_k=None, max_support=64)
    assert (e.value.status, e.value.param) == (422, "messages")
