"""The OpenAI-shaped API's requests: the body structs and their translation into a
GenerateRequest (no I/O here; pp1q.verifier.openai_routes serves, pp1q.verifier.openai_api
shapes the answers).

Requests are decoded strictly (unknown fields refused, like /v1/generate: a field we
would silently ignore could change what the client believes it asked for) and then
translated into a /v1/generate body, so every check of the native API (ids < vocab,
max_tokens, seed, temperature, proposal support) applies unchanged.

Text: a target with a tokenizer (``encode(str) -> list[int]``, ``decode(list[int]) -> str``,
optional ``apply_chat_template(messages) -> list[int]``) takes text prompts, chat
messages and stop strings. A target without one (the toy) takes token-id prompts only:
a ``prompt`` list of ids, or for chat a message content made of parts
``{"type": "token_ids", "token_ids": [...]}`` (a pp1q extension; the ids of every message
are concatenated in order, no template).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Protocol

import msgspec

from pp1q.verifier.api import MAX_NEW_TOKENS, MAX_PROMPT_TOKENS, GenerateRequest, decode_generate
from pp1q.verifier.http import HttpError

MAX_STOP = 4  # stop sequences per request, as OpenAI's API
MAX_STOP_TOKEN_IDS = 64  # stop token ids per request; a handful is the real use
MAX_MESSAGES = 1024  # chat messages per request; the body size bounds them anyway


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False


class Pp1qOptions(msgspec.Struct, forbid_unknown_fields=True):
    """The ``pp1q`` extension object (openai client: ``extra_body={"pp1q": {...}}``)."""

    speculative: bool = True
    draft_temperature: float = 1.0
    draft_top_k: int | None | msgspec.UnsetType = msgspec.UNSET  # proposal support


_Ids = Annotated[list[Annotated[int, msgspec.Meta(ge=0)]],
                 msgspec.Meta(min_length=1, max_length=MAX_PROMPT_TOKENS)]
_Stop = str | Annotated[list[str], msgspec.Meta(max_length=MAX_STOP)] | None


class _Common(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: str | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_NEW_TOKENS)] = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # the target's top-k (vLLM's extension); -1 or 0: off
    stop: _Stop = None
    stop_token_ids: Annotated[list[Annotated[int, msgspec.Meta(ge=0)]],
                              msgspec.Meta(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    seed: Annotated[int, msgspec.Meta(ge=0)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] = 1  # one choice per request
    user: str | None = None  # accepted and not used
    pp1q: Pp1qOptions = msgspec.field(default_factory=Pp1qOptions)


class CompletionBody(_Common, kw_only=True):
    prompt: str | _Ids


class TokenIdsPart(msgspec.Struct, tag_field="type", tag="token_ids", forbid_unknown_fields=True):
    token_ids: _Ids


class TextPart(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    text: str


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    content: str | list[TokenIdsPart | TextPart]
    name: str | None = None


class ChatBody(_Common, kw_only=True):
    messages: Annotated[list[Message], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]


@dataclass
class Call:
    """A decoded OpenAI request: what to run and how to answer."""

    req: GenerateRequest
    body: _Common
    stop_ids: frozenset[int]
    stop_strs: tuple[str, ...]
    chat: bool


def _decode(cls, raw: bytes):
    try:
        return msgspec.json.decode(raw, type=cls)
    except msgspec.ValidationError as e:
        raise HttpError(422, "invalid_field", str(e)) from None
    except msgspec.DecodeError as e:
        raise HttpError(400, "bad_json", str(e)) from None


def _needs_tokenizer(what: str) -> HttpError:
    return HttpError(400, "needs_tokenizer",
                     f"{what} needs a target with a tokenizer; this target takes token ids "
                     "(a prompt list of ids; chat: content parts of type token_ids)")


def _chat_prompt(messages: list[Message], tokenizer) -> list[int]:
    if tokenizer is not None and hasattr(tokenizer, "apply_chat_template"):
        if any(not isinstance(m.content, str) for m in messages):
            raise HttpError(422, "invalid_field", "chat content must be text for this target")
        if not getattr(tokenizer, "has_chat_template", True):  # TextCodec says so
            raise HttpError(422, "no_chat_template",
                            "the target's tokenizer has no chat template")
        try:
            return list(tokenizer.apply_chat_template([{"role": m.role, "content": m.content}
                                                       for m in messages]))
        except ValueError as e:
            raise HttpError(422, "invalid_field", str(e)) from None
    ids: list[int] = []
    for m in messages:
        if isinstance(m.content, str) or any(isinstance(p, TextPart) for p in m.content):
            raise _needs_tokenizer("chat text")
        for part in m.content:
            ids.extend(part.token_ids)
    if not ids:
        raise HttpError(422, "invalid_field", "chat messages hold no token ids")
    return ids


def decode_call(raw: bytes, *, chat: bool, tokenizer: Tokenizer | None, model_id: str,
                vocab: int, default_top_k: int | None, max_support: int,
                text=None) -> Call:
    """Decode and check an OpenAI body; every refusal is an HttpError 4xx. The target's
    processors (temperature, top_p, top_k) are checked by decode_generate (``text``: the
    target's TextCodec, passed through)."""
    b = _decode(ChatBody if chat else CompletionBody, raw)
    if b.model is not None and b.model != model_id:
        raise HttpError(404, "model_not_found", f"model {b.model!r}: this server serves "
                                                f"{model_id!r} (GET /v1/models)")
    stop_strs = (b.stop,) if isinstance(b.stop, str) else tuple(b.stop or ())
    if any(not s for s in stop_strs):
        raise HttpError(422, "invalid_field", "empty stop string")
    if stop_strs and tokenizer is None:
        raise _needs_tokenizer("a stop string")
    if chat:
        prompt = _chat_prompt(b.messages, tokenizer)
    elif isinstance(b.prompt, str):
        if tokenizer is None:
            raise _needs_tokenizer("a text prompt")
        prompt = list(tokenizer.encode(b.prompt))
    else:
        prompt = b.prompt
    bad = next((t for t in b.stop_token_ids or () if t >= vocab), None)
    if bad is not None:
        raise HttpError(422, "token_out_of_vocab",
                        f"stop token id {bad} outside the vocabulary [0, {vocab})")
    native: dict[str, Any] = {"prompt_token_ids": prompt, "max_tokens": b.max_tokens,
                              "temperature": b.temperature,
                              "speculative": b.pp1q.speculative,
                              "draft_temperature": b.pp1q.draft_temperature}
    if b.top_p != 1.0:
        native["top_p"] = b.top_p
    if b.top_k > 0:  # -1 and 0 mean off, as vLLM's
        native["target_top_k"] = b.top_k
    if b.seed is not None:
        native["seed"] = b.seed
    if b.pp1q.draft_top_k is not msgspec.UNSET:
        native["top_k"] = b.pp1q.draft_top_k
    try:
        req = decode_generate(msgspec.json.encode(native), vocab=vocab,
                              default_top_k=default_top_k, max_support=max_support, text=text)
    except HttpError as e:  # name the field as the client sent it, not its native name
        raise HttpError(e.status, e.code, _openai_paths(e.message, chat)) from None
    return Call(req, b, frozenset(b.stop_token_ids or ()), stop_strs, chat)


# the native fields decode_generate checks, by the OpenAI body's name for each
_OPENAI_PATH = {"$.draft_temperature": "$.pp1q.draft_temperature",
                "$.top_k": "$.pp1q.draft_top_k", "$.target_top_k": "$.top_k"}


def _openai_paths(message: str, chat: bool) -> str:
    """``message`` with each native field path (msgspec's `` `$.name` ``) as the OpenAI
    body names it."""
    paths = {**_OPENAI_PATH, "$.prompt_token_ids": "$.messages" if chat else "$.prompt"}
    for native, openai in paths.items():
        message = message.replace(f"`{native}`", f"`{openai}`")
    return message
