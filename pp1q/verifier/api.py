"""The verifier's HTTP API: request schema, strict decoding, result shape.

``POST /v1/generate`` body (JSON, unknown fields refused):

    prompt_token_ids   list of token ids in [0, vocab), 1..MAX_PROMPT_TOKENS of them
    prompt             text instead of prompt_token_ids (exactly one of the two): encoded
                       with the target's tokenizer (real models only); the answer then
                       carries ``text`` too
    chat               true: ``prompt`` is one user message in the target's chat template
    max_tokens         tokens to generate, 1..MAX_NEW_TOKENS
    seed               request seed (64-bit); absent: drawn by the server and returned
    speculative        true (default): draft on the worker and verify; false: target-only
    temperature        target temperature: >= MIN_TEMPERATURE samples the processed target
                       p (default 1), 0 is greedy (v1)
    top_p, target_top_k  the target's nucleus and top-k processors (absent: none); p is
                       processed the same way for rounds and target-only steps
    draft_temperature  proposal temperature on the worker (>= MIN_TEMPERATURE, default 1)
    top_k              proposal support: an int k (sparse top-k; k >= vocab means dense)
                       or null (dense); absent: the verifier's configured default
    stop_token_ids     ids that end the request (finish_reason "stop"), besides the
                       target's EOS ids unless ``ignore_eos``
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from pp1q.core.outcomes import FallbackCause
from pp1q.models.processors import Processors, normalised
from pp1q.models.text import TextCodec
from pp1q.verifier.http import HttpError

MAX_PROMPT_TOKENS = 65536  # bounds the per-request prefix memory and JSON body size
MAX_NEW_TOKENS = 4096  # bounds one request's hold on a slot
MAX_SEED = (1 << 64) - 1  # pp1q.core.rng keys are 64-bit
MAX_PROMPT_CHARS = 1 << 20  # bounds tokenizer work before the token bound can apply
MAX_STOP_IDS = 64  # a stop set is looked up per committed token; keep it small
MAX_TEMPERATURE = 100.0  # beyond this p is uniform to float64 precision anyway
# below this a temperature (target or draft) is refused: logits / T overflows float64 for
# subnormal T (a 500 and a traceback per request, a refused draft every round), and no
# sampling use needs T under a millionth (vLLM takes T < 1e-5 as greedy)
MIN_TEMPERATURE = 1e-6


TokenId = Annotated[int, msgspec.Meta(ge=0)]


class GenerateBody(msgspec.Struct, forbid_unknown_fields=True):
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_NEW_TOKENS)]
    prompt_token_ids: Annotated[list[TokenId], msgspec.Meta(
        min_length=1, max_length=MAX_PROMPT_TOKENS)] | None = None
    prompt: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_PROMPT_CHARS)] | None = None
    chat: bool = False
    seed: Annotated[int, msgspec.Meta(ge=0)] | None = None  # <= MAX_SEED checked below
    speculative: bool = True
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TEMPERATURE)] = 1.0
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    target_top_k: Annotated[int, msgspec.Meta(ge=1)] | None = None
    stop_token_ids: Annotated[list[TokenId], msgspec.Meta(max_length=MAX_STOP_IDS)] = []
    ignore_eos: bool = False
    draft_temperature: Annotated[float, msgspec.Meta(ge=MIN_TEMPERATURE,
                                                     le=MAX_TEMPERATURE)] = 1.0
    top_k: Annotated[int, msgspec.Meta(ge=1)] | None | msgspec.UnsetType = msgspec.UNSET


@dataclass
class GenerateRequest:
    """A decoded, checked request (what the scheduler runs)."""

    prompt: list[int]
    max_tokens: int
    seed: int
    speculative: bool
    greedy: bool
    draft_temperature: float
    top_k: int | None
    processors: Processors = field(default_factory=Processors)  # the target's (not greedy)
    stop_ids: frozenset[int] = frozenset()  # EOS (unless ignore_eos) and stop_token_ids
    text: bool = False  # answer with ``text`` (a text prompt was given)


@dataclass
class RequestStats:
    rounds: int = 0  # verified proposals (speculative or greedy)
    drafted: int = 0
    accepted: int = 0
    target_only_steps: int = 0  # includes fallback steps
    fallbacks: dict[str, int] = field(
        default_factory=lambda: {c.value: 0 for c in FallbackCause})

    def as_json(self) -> dict:
        mean = self.accepted / self.rounds if self.rounds else None
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "mean_accepted_length": mean, "target_only_steps": self.target_only_steps,
                "fallbacks": dict(self.fallbacks)}


_decoder = msgspec.json.Decoder(GenerateBody)


def decode_generate(body: bytes, *, vocab: int, default_top_k: int | None,
                    max_support: int, text: TextCodec | None = None) -> GenerateRequest:
    """Decode and check a generate body; every refusal is an HttpError 400 or 422.
    ``text``: the target's tokenizer (None: token ids only, as for the toy)."""
    try:
        b = _decoder.decode(body)
    except msgspec.ValidationError as e:
        raise HttpError(422, "invalid_field", str(e)) from None
    except msgspec.DecodeError as e:
        raise HttpError(400, "bad_json", str(e)) from None
    if b.seed is not None and b.seed > MAX_SEED:
        raise HttpError(422, "invalid_field", f"seed {b.seed} above 2^64 - 1 - at `$.seed`")
    if 0.0 < b.temperature < MIN_TEMPERATURE:
        raise HttpError(422, "invalid_field", f"temperature {b.temperature!r}: 0 (greedy) or "
                        f"at least {MIN_TEMPERATURE:g} - at `$.temperature`")
    prompt = _prompt_ids(b, text)
    # each refusal past the schema names its field as msgspec's do (`$.name`: the error
    # object's param)
    for path, ids in (("prompt" if b.prompt is not None else "prompt_token_ids", prompt),
                      ("stop_token_ids", b.stop_token_ids)):
        bad = next((t for t in ids if t >= vocab), None)
        if bad is not None:
            raise HttpError(422, "token_out_of_vocab",
                            f"token id {bad} outside the vocabulary [0, {vocab}) - at `$.{path}`")
    top_k = default_top_k if b.top_k is msgspec.UNSET else b.top_k
    if top_k is not None and top_k >= vocab:
        top_k = None  # the k largest of vocab ids, k >= vocab: every id, i.e. dense
    if top_k is not None and top_k > max_support:
        at = "" if b.top_k is msgspec.UNSET else " - at `$.top_k`"  # else the verifier's own
        raise HttpError(422, "top_k_too_large",
                        f"top_k {top_k} above the negotiated support bound {max_support}{at}")
    greedy = b.temperature == 0.0
    processors = Processors() if greedy else normalised(b.temperature, b.target_top_k,
                                                        b.top_p, vocab)
    stop = set(b.stop_token_ids)
    if text is not None and not b.ignore_eos:
        stop |= text.eos_ids
    seed = b.seed if b.seed is not None else int.from_bytes(os.urandom(8), "little")
    return GenerateRequest(prompt=prompt, max_tokens=b.max_tokens, seed=seed,
                           speculative=b.speculative, greedy=greedy,
                           draft_temperature=b.draft_temperature, top_k=top_k,
                           processors=processors, stop_ids=frozenset(stop),
                           text=b.prompt is not None)


def _prompt_ids(b: GenerateBody, text: TextCodec | None) -> list[int]:
    if (b.prompt is None) == (b.prompt_token_ids is None):
        raise HttpError(422, "invalid_field", "give exactly one of prompt, prompt_token_ids")
    if b.prompt_token_ids is not None:
        if b.chat:
            raise HttpError(422, "invalid_field", "chat applies to a text prompt only")
        return list(b.prompt_token_ids)
    if text is None:
        raise HttpError(422, "no_tokenizer",
                        "this verifier's model has no tokenizer: send prompt_token_ids")
    if b.chat and not text.has_chat_template:
        raise HttpError(422, "no_chat_template", "the target's tokenizer has no chat template")
    ids = text.encode(b.prompt, chat=b.chat)
    if not 1 <= len(ids) <= MAX_PROMPT_TOKENS:
        raise HttpError(422, "invalid_field",
                        f"prompt encodes to {len(ids)} tokens (1..{MAX_PROMPT_TOKENS})")
    return ids


def finish(tokens: list[int], max_tokens: int, stop_ids: frozenset[int]) -> tuple[list[int], str]:
    """The answer's tokens and finish reason: up to and including the first stop id
    ("stop"), else the first ``max_tokens`` ("length"). Tokens a round committed after
    a stop id are dropped: target-only sampling would have ended there too."""
    for i, t in enumerate(tokens[:max_tokens]):
        if t in stop_ids:
            return tokens[: i + 1], "stop"
    return tokens[:max_tokens], "length"
