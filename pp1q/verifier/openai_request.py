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
DEFAULT_MAX_TOKENS = 16  # a completion's, as OpenAI's (a chat's: what the context leaves)


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool | None = None  # None: false
    # OpenAI pads each chunk with an ``obfuscation`` field against length side channels;
    # not implemented: taken only as null or false (_check_unimplemented)
    include_obfuscation: bool | None = None


class Pp1qOptions(msgspec.Struct, forbid_unknown_fields=True):
    """The ``pp1q`` extension object (openai client: ``extra_body={"pp1q": {...}}``)."""

    speculative: bool = True
    draft_temperature: float = 1.0
    draft_top_k: int | None | msgspec.UnsetType = msgspec.UNSET  # proposal support


_Ids = Annotated[list[Annotated[int, msgspec.Meta(ge=0)]],
                 msgspec.Meta(min_length=1, max_length=MAX_PROMPT_TOKENS)]
_Stop = str | Annotated[list[str], msgspec.Meta(max_length=MAX_STOP)] | None


_MaxTokens = Annotated[int, msgspec.Meta(ge=1, le=MAX_NEW_TOKENS)] | None


class _Common(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Every nullable OpenAI field takes null as its default, as OpenAI's (openai's client
    sends ``max_tokens=None`` as null)."""

    model: str | None = None
    max_tokens: _MaxTokens = None
    temperature: float | None = None  # None: 1
    top_p: float | None = None  # None: 1
    # the target's top-k (vLLM's extension); -1, 0 or None: off. Another negative is
    # refused, as vLLM refuses it: read as off, a client's typo would sample untruncated
    top_k: Annotated[int, msgspec.Meta(ge=-1)] | None = None
    stop: _Stop = None
    stop_token_ids: Annotated[list[Annotated[int, msgspec.Meta(ge=0)]],
                              msgspec.Meta(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    # OpenAI's seeds are int64: a negative one is taken as its 64-bit two's complement
    # (the native seed is unsigned; the answer returns that form, which repeats it). Its
    # upper bound, 2^64 - 1, is the native request's (msgspec bounds only int64)
    seed: Annotated[int, msgspec.Meta(ge=-(1 << 63))] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] | None = None  # one choice per request
    user: str | None = None  # accepted and not used (it changes no answer)
    pp1q: Pp1qOptions = msgspec.field(default_factory=Pp1qOptions)
    # not implemented: taken at their defaults only (_AT_DEFAULT)
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None


class CompletionBody(_Common, kw_only=True):
    prompt: str | _Ids
    best_of: int | None = None  # these four: taken at their defaults only (_AT_DEFAULT)
    echo: bool | None = None
    logprobs: int | None = None
    suffix: str | None = None


class TokenIdsPart(msgspec.Struct, tag_field="type", tag="token_ids", forbid_unknown_fields=True):
    token_ids: _Ids


class TextPart(msgspec.Struct, tag_field="type", tag="text", forbid_unknown_fields=True):
    text: str


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    content: str | list[TokenIdsPart | TextPart]
    name: str | None = None


# metadata: OpenAI's own bounds (it refuses more), so a client's tags fit both servers
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64  # characters
MAX_METADATA_VALUE = 512  # characters
_Metadata = Annotated[dict[Annotated[str, msgspec.Meta(max_length=MAX_METADATA_KEY)],
                           Annotated[str, msgspec.Meta(max_length=MAX_METADATA_VALUE)]],
                      msgspec.Meta(max_length=MAX_METADATA_PAIRS)]


class ChatBody(_Common, kw_only=True):
    messages: Annotated[list[Message], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: _MaxTokens = None  # OpenAI's newer name for a chat's max_tokens
    logprobs: bool | None = None  # these five: taken at their defaults only (_AT_DEFAULT)
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # OpenAI's newer chat fields (openai 3.63's ``chat.completions.create``). These change
    # no answer, whatever their value: taken and not used, as ``user``
    parallel_tool_calls: bool | None = None  # no tool is ever called (tools: [] only)
    prompt_cache_key: str | None = None  # a cache-routing hint
    safety_identifier: str | None = None  # an end user's id, as ``user``
    metadata: _Metadata | None = None  # tags of a stored completion (store: false only)
    # these ask for something this server does not do: taken at their neutral values
    # only (_AT_DEFAULT)
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    functions: list[Any] | None = None  # tools' and tool_choice's deprecated names
    function_call: str | dict[str, Any] | None = None


# OpenAI's fields this server does not implement, with the values that ask for nothing
# (their defaults; null too): taken, as OpenAI takes them. Any other value is refused,
# since ignoring it would change the answer (a penalty, a bias, log-probabilities, a
# format, a tool call, audio, reasoning) or what the client believes was done for it (a
# completion stored, a service tier, a prompt cache kept, moderation, an obfuscated
# stream). A value matches only with its JSON type (completions' logprobs 0 asks for
# the sampled token's logprob; false is chat's "none"). tool_choice "auto" (and
# function_call's) with no tools can call none: as "none".
_AT_DEFAULT: dict[str, tuple] = {
    "frequency_penalty": (0.0,), "presence_penalty": (0.0,), "logit_bias": ({},),
    "best_of": (1,), "echo": (False,), "logprobs": (False,), "suffix": (),
    "top_logprobs": (0,), "response_format": ({"type": "text"},), "tools": ([],),
    "tool_choice": ("none", "auto"), "functions": ([],), "function_call": ("none", "auto"),
    "store": (False,), "service_tier": ("auto", "default"), "reasoning_effort": ("none",),
    "verbosity": ("medium",), "modalities": (["text"],), "audio": (), "prediction": (),
    "web_search_options": (), "moderation": (), "prompt_cache_retention": (),
    "prompt_cache_options": (), "stream_options.include_obfuscation": (False,)}


def _field(b: _Common, path: str):
    """The body's value at ``path`` (``a.b``: a field of the object at ``a``), None
    where absent."""
    for name in path.split("."):
        b = getattr(b, name, None)
    return b


def _check_unimplemented(b: _Common) -> None:
    for name, defaults in _AT_DEFAULT.items():
        v = _field(b, name)
        if v is not None and not any(type(v) is type(d) and v == d for d in defaults):
            allowed = " or ".join(["null", *(msgspec.json.encode(d).decode() for d in defaults)])
            raise HttpError(422, "unsupported_field",
                            f"`{name}` is not supported by this server (ignoring it would "
                            f"change the answer or what was done for it): leave it out or "
                            f"send {allowed}", param=name)


@dataclass
class Call:
    """A decoded OpenAI request: what to run and how to answer."""

    req: GenerateRequest
    body: _Common
    stop_ids: frozenset[int]
    stop_strs: tuple[str, ...]
    chat: bool
    open_max: bool = False  # a chat without max_tokens: what the target's context leaves


def _max_tokens(b: _Common, chat: bool) -> tuple[int, bool]:
    """The request's max_tokens, and whether it was left open (a chat without one:
    OpenAI's chat generates up to the context; ``fit_open_max`` bounds it there)."""
    n = b.max_tokens
    if chat and b.max_completion_tokens is not None:
        if n is not None and n != b.max_completion_tokens:
            raise HttpError(422, "invalid_field", f"max_completion_tokens "
                            f"{b.max_completion_tokens} and max_tokens {n} disagree: send one",
                            param="max_completion_tokens")
        n = b.max_completion_tokens
    if n is not None:
        return n, False
    return (MAX_NEW_TOKENS, True) if chat else (DEFAULT_MAX_TOKENS, False)


def fit_open_max(call: Call, max_positions: int | None) -> None:
    """An open chat's max_tokens: what the target's context (``max_positions``) leaves
    after its prompt, within MAX_NEW_TOKENS (at least 1: a prompt filling the context
    is then refused as context_length_exceeded)."""
    if call.open_max and max_positions is not None:
        call.req.max_tokens = max(1, min(call.req.max_tokens,
                                         max_positions - len(call.req.prompt)))


def _decode(cls, raw: bytes):
    try:
        return msgspec.json.decode(raw, type=cls)
    except msgspec.ValidationError as e:
        raise HttpError(422, "invalid_field", str(e)) from None
    except msgspec.DecodeError as e:
        raise HttpError(400, "bad_json", str(e)) from None


def _needs_tokenizer(what: str, param: str) -> HttpError:
    return HttpError(400, "needs_tokenizer",
                     f"{what} needs a target with a tokenizer; this target takes token ids "
                     "(a prompt list of ids; chat: content parts of type token_ids)", param=param)


def _template_message(m: Message) -> dict[str, str]:
    """A message as the chat template takes it: its content as one text (OpenAI's text
    parts joined by newlines, as vLLM joins them), its ``name`` when given."""
    if isinstance(m.content, str):
        content = m.content
    elif all(isinstance(p, TextPart) for p in m.content):
        content = "\n".join(p.text for p in m.content)
    else:
        raise HttpError(422, "invalid_field", "chat content must be text (a string or "
                        "parts of type text) for this target", param="messages")
    return {"role": m.role, "content": content} | ({"name": m.name} if m.name else {})


def _chat_prompt(messages: list[Message], tokenizer) -> list[int]:
    if tokenizer is not None and hasattr(tokenizer, "apply_chat_template"):
        rendered = [_template_message(m) for m in messages]
        if not getattr(tokenizer, "has_chat_template", True):  # TextCodec says so
            raise HttpError(422, "no_chat_template",
                            "the target's tokenizer has no chat template")
        try:
            return list(tokenizer.apply_chat_template(rendered))
        except ValueError as e:  # the template's refusal of these messages
            raise HttpError(422, "invalid_field", str(e), param="messages") from None
    ids: list[int] = []
    for m in messages:
        if isinstance(m.content, str) or any(isinstance(p, TextPart) for p in m.content):
            raise _needs_tokenizer("chat text", "messages")
        for part in m.content:
            ids.extend(part.token_ids)
    if not ids:
        raise HttpError(422, "invalid_field", "chat messages hold no token ids",
                        param="messages")
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
                                                f"{model_id!r} (GET /v1/models)", param="model")
    _check_unimplemented(b)
    if b.stream_options is not None and not b.stream:  # OpenAI's own refusal
        raise HttpError(400, "invalid_field", "stream_options is only allowed with stream "
                        "true", param="stream_options")
    max_tokens, open_max = _max_tokens(b, chat)
    stop_strs = (b.stop,) if isinstance(b.stop, str) else tuple(b.stop or ())
    if any(not s for s in stop_strs):
        raise HttpError(422, "invalid_field", "empty stop string", param="stop")
    if stop_strs and tokenizer is None:
        raise _needs_tokenizer("a stop string", "stop")
    if chat:
        prompt = _chat_prompt(b.messages, tokenizer)
    elif isinstance(b.prompt, str):
        if tokenizer is None:
            raise _needs_tokenizer("a text prompt", "prompt")
        prompt = list(tokenizer.encode(b.prompt))
    else:
        prompt = b.prompt
    bad = next((t for t in b.stop_token_ids or () if t >= vocab), None)
    if bad is not None:
        raise HttpError(422, "token_out_of_vocab",
                        f"stop token id {bad} outside the vocabulary [0, {vocab})",
                        param="stop_token_ids")
    native: dict[str, Any] = {"prompt_token_ids": prompt, "max_tokens": max_tokens,
                              "temperature": 1.0 if b.temperature is None else b.temperature,
                              "speculative": b.pp1q.speculative,
                              "draft_temperature": b.pp1q.draft_temperature}
    if b.top_p is not None and b.top_p != 1.0:
        native["top_p"] = b.top_p
    if b.top_k is not None and b.top_k > 0:  # -1 and 0 mean off, as vLLM's
        native["target_top_k"] = b.top_k
    if b.seed is not None:
        native["seed"] = b.seed + (1 << 64) if b.seed < 0 else b.seed
    if b.pp1q.draft_top_k is not msgspec.UNSET:
        native["top_k"] = b.pp1q.draft_top_k
    try:
        req = decode_generate(msgspec.json.encode(native), vocab=vocab,
                              default_top_k=default_top_k, max_support=max_support, text=text)
    except HttpError as e:  # name the field as the client sent it, not its native name
        raise HttpError(e.status, e.code, _openai_paths(e.message, chat)) from None
    return Call(req, b, frozenset(b.stop_token_ids or ()), stop_strs, chat, open_max)


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
