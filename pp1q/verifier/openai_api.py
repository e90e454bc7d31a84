"""The OpenAI-shaped API: request structs, their translation into a GenerateRequest,
answers and server-sent-event chunks (no I/O here; pp1q.verifier.openai_routes serves).

Requests are decoded strictly (unknown fields refused, like /v1/generate: a field we
would silently ignore could change what the client believes it asked for) and then
translated into a /v1/generate body, so every check of the native API (ids < vocab,
max_tokens, seed, temperature, proposal support) applies unchanged.

Text: a target with a tokenizer (``encode(str) -> list[int]``, ``decode(list[int]) -> str``,
optional ``apply_chat_template(messages) -> list[int]``) takes text prompts, chat
messages and stop strings. A target without one (the toy) takes token-id prompts only:
a ``prompt`` list of ids, or for chat a message content made of parts
``{"type": "token_ids", "token_ids": [...]}`` (a pp1q extension; the ids of every message
are concatenated in order, no template); its ``text`` renders each token as `` <id>``.
Every choice also carries the ``token_ids`` it produced.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

import msgspec

from pp1q.verifier.api import MAX_NEW_TOKENS, MAX_PROMPT_TOKENS, GenerateRequest, decode_generate
from pp1q.verifier.detokenize import REPLACEMENT, IncrementalText, followable, unfollowed
from pp1q.verifier.http import HttpError

MAX_STOP = 4  # stop sequences per request, as OpenAI's API
MAX_STOP_TOKEN_IDS = 64  # stop token ids per request; a handful is the real use
MAX_MESSAGES = 1024  # chat messages per request; the body size bounds them anyway


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class IdText:
    """Text of a target without a tokenizer: each token as `` <id>`` (deltas concatenate
    to the whole text, as a real tokenizer's do)."""

    @staticmethod
    def decode(ids: list[int]) -> str:
        return "".join(f" {t}" for t in ids)


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
    # the target's top-k (vLLM's extension); -1 or 0: off. Another negative is refused,
    # as vLLM refuses it: read as off, a client's typo would silently sample untruncated
    top_k: Annotated[int, msgspec.Meta(ge=-1)] = -1
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


def _first(text: str, stops: tuple[str, ...]) -> int | None:
    return min((i for i in (text.find(s) for s in stops) if i >= 0), default=None)


class Stopper:
    """Where the output ends: at the first stop token id (excluded, as vLLM's
    stop_token_ids) or stop string (excluded, as OpenAI's); holds back the text that could
    still become a stop string, or the rest of a character split across tokens, so a
    stream never shows what the whole answer does not.

    Cost: the text is followed in a window (pp1q.verifier.detokenize: each round decodes
    its new ids and the few before them) and stop strings are looked for only where a
    new one could be (the last ``len(longest stop) - 1`` settled characters and the new
    text), so a request costs O(its ids), where decoding every id each round cost
    O(ids^2) (3.66 CPU-s for 4,096 tokens with a stop string on SmolLM2's tokenizer).
    The answer's text is one whole decode at the end, as before, cut at the stop string.

    Exactness: the window's text is the whole decode's for a local, prefix-stable decode
    (byte-level BPE, SentencePiece, the toy's ``IdText``). A decode that is not (HF's
    ``clean_up_tokenization_spaces``) is caught in the window, and the request goes on
    decoding every id each round: today's path, with today's text and deltas from that
    round on. One that depends on text further back than the window (no tokenizer we
    know) is caught when the answer's whole decode differs from the window's text: the
    answer is the whole decode's (its stop string looked for there; its stream may have
    shown the window's text), and every later Stopper on that decoder decodes in full.
    """

    def __init__(self, call: Call, text: Tokenizer | IdText) -> None:
        self.stop_ids, self.stop_strs, self.text = call.stop_ids, call.stop_strs, text
        self.ids: list[int] = []
        self.shown = 0  # characters of the text already handed out
        self.stopped = False
        self._cut: int | None = None  # end of the text when a stop string matched
        self._longest = max(map(len, self.stop_strs), default=0)
        # the text followed in a window; None: every id decoded each round
        self._inc: IncrementalText | None = IncrementalText(text) if followable(text) else None
        self._searched = 0  # settled characters looked through for stop strings
        # the whole decode of the first ``_decoded`` ids (ids only grow: a count names them)
        self._decoded, self._text = 0, ""
        self._checked = 0  # ids whose whole decode was compared with the window's text

    def _decode(self) -> str:
        if self._decoded != len(self.ids):
            self._decoded, self._text = len(self.ids), self.text.decode(self.ids)
        return self._text

    def _follow(self) -> IncrementalText | None:
        """The window's text up to date, or None from the round the window could not
        follow (decoded in full from then on)."""
        if self._inc is not None and not self._inc.update(self.ids):
            self._inc = None
        return self._inc

    def feed(self, new: list[int]) -> bool:
        """Take a round's committed tokens; True when the output ended in them."""
        stop_id = False
        for t in new:
            if t in self.stop_ids:
                stop_id = True  # the ids before it may still hold a stop string: look
                break
            self.ids.append(t)
        self.stopped = self.stopped or stop_id
        if self.stop_strs and self._cut is None:
            inc = self._follow()
            if inc is None:
                start, text = 0, self._decode()
            else:  # a stop string ending in settled text was found when that was new
                start = max(0, self._searched - (self._longest - 1))
                text, self._searched = inc.since(start), inc.committed
            hit = _first(text, self.stop_strs)
            if hit is not None:
                self._cut, self.stopped = start + hit, True
        return self.stopped

    def full_text(self) -> str:
        """The answer's text: the whole decode, cut at the stop string (checked against
        the window's text the first time for these ids)."""
        full = self._decode()
        if self._checked != len(self.ids):
            self._checked = len(self.ids)
            inc = self._inc
            if inc is not None and inc.n and self._follow() is not None and inc.whole() != full:
                self._unfollowed(full)
        return full[: self._cut]

    def _unfollowed(self, full: str) -> None:
        unfollowed(self.text)  # later requests decode in full from the start
        self._inc = None
        if self.stop_strs:
            hit = _first(full, self.stop_strs)
            self._cut, self.stopped = hit, self.stopped or hit is not None

    def delta(self, final: bool) -> str:
        """Text not yet handed out; before the end, less what a stop string could start
        and less a trailing character still undecoded (U+FFFD until its last byte)."""
        if final or self.stopped:
            full = self.full_text()
            out, self.shown = full[self.shown:], max(self.shown, len(full))
            return out
        inc = self._follow()
        rest = self._decode()[self.shown:] if inc is None else inc.since(self.shown)
        # an unfinished character may complete a stop string begun in the settled text
        # before it: hold back from where the settled text ends, not from the text's end
        end = self.shown + len(rest.rstrip(REPLACEMENT))
        if self.stop_strs:
            end -= self._longest - 1
        end = max(self.shown, end)
        out, self.shown = rest[: end - self.shown], end
        return out


def completion_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + os.urandom(12).hex()


def usage(call: Call, n_out: int) -> dict:
    n_in = len(call.req.prompt)
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


def extension(answer: dict) -> dict:
    """pp1q's statistics of one request (the ``pp1q`` field of an answer)."""
    return {"seed": answer["seed"], "stats": answer["stats"], "elapsed_s": answer["elapsed_s"]}


def _choice(chat: bool, text: str, ids: list[int], finish: str | None, stream: bool) -> dict:
    if not chat:
        return {"index": 0, "text": text, "token_ids": ids, "logprobs": None,
                "finish_reason": finish}
    key = "delta" if stream else "message"
    return {"index": 0, key: {"role": "assistant", "content": text}, "token_ids": ids,
            "logprobs": None, "finish_reason": finish}


@dataclass
class Shape:
    """The envelope every object of one answer shares."""

    chat: bool
    model: str
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        self.id = self.id or completion_id(self.chat)
        self.created = self.created or int(time.time())

    def _env(self, stream: bool) -> dict:
        obj = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if stream and self.chat else "")
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def answer(self, call: Call, stopper: Stopper, answer: dict) -> dict:
        finish = "stop" if stopper.stopped else answer["finish_reason"]
        return {**self._env(False), "choices": [_choice(
            self.chat, stopper.full_text(), stopper.ids, finish, False)],
            "usage": usage(call, len(stopper.ids)), "pp1q": extension(answer)}

    def chunk(self, text: str, ids: list[int], finish: str | None = None,
              answer: dict | None = None) -> dict:
        out = {**self._env(True), "choices": [_choice(self.chat, text, ids, finish, True)]}
        if answer is not None:
            out["pp1q"] = extension(answer)
        return out

    def usage_chunk(self, call: Call, n_out: int) -> dict:
        return {**self._env(True), "choices": [], "usage": usage(call, n_out)}


def sse(obj: dict | str) -> bytes:
    """One server-sent event (``data: [DONE]`` ends a stream, as OpenAI's)."""
    data = obj if isinstance(obj, str) else msgspec.json.encode(obj).decode()
    return f"data: {data}\n\n".encode()
