"""The verifier's HTTP API: request schema, strict decoding, result shape.

``POST /v1/generate`` body (JSON, unknown fields refused):

    prompt_token_ids   list of token ids in [0, vocab), 1..MAX_PROMPT_TOKENS of them
    max_tokens         tokens to generate, 1..MAX_NEW_TOKENS
    seed               request seed (64-bit); absent: drawn by the server and returned
    speculative        true (default): draft on the worker and verify; false: target-only
    temperature        1 (default: sample from the target p at T = 1) or 0 (greedy, v1)
    draft_temperature  proposal temperature on the worker (> 0, default 1)
    top_k              proposal support: an int k (sparse top-k; k >= vocab means dense)
                       or null (dense); absent: the verifier's configured default
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from pp1q.core.outcomes import FallbackCause
from pp1q.verifier.http import HttpError

MAX_PROMPT_TOKENS = 65536  # bounds the per-request prefix memory and JSON body size
MAX_NEW_TOKENS = 4096  # bounds one request's hold on a slot
MAX_SEED = (1 << 64) - 1  # pp1q.core.rng keys are 64-bit


class GenerateBody(msgspec.Struct, forbid_unknown_fields=True):
    prompt_token_ids: Annotated[list[Annotated[int, msgspec.Meta(ge=0)]],
                                msgspec.Meta(min_length=1, max_length=MAX_PROMPT_TOKENS)]
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_NEW_TOKENS)]
    seed: Annotated[int, msgspec.Meta(ge=0)] | None = None  # <= MAX_SEED checked below
    speculative: bool = True
    temperature: float = 1.0
    draft_temperature: Annotated[float, msgspec.Meta(gt=0.0, le=100.0)] = 1.0
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
                    max_support: int) -> GenerateRequest:
    """Decode and check a generate body; every refusal is an HttpError 400/415/422."""
    try:
        b = _decoder.decode(body)
    except msgspec.ValidationError as e:
        raise HttpError(422, "invalid_field", str(e)) from None
    except msgspec.DecodeError as e:
        raise HttpError(400, "bad_json", str(e)) from None
    if b.seed is not None and b.seed > MAX_SEED:
        raise HttpError(422, "invalid_field", f"seed {b.seed} above 2^64 - 1 - at `$.seed`")
    bad = next((t for t in b.prompt_token_ids if t >= vocab), None)
    if bad is not None:
        raise HttpError(422, "token_out_of_vocab",
                        f"prompt token id {bad} outside the vocabulary [0, {vocab})")
    if b.temperature not in (0.0, 1.0):
        raise HttpError(422, "unsupported_temperature",
                        "temperature must be 1 (sample the target p) or 0 (greedy)")
    top_k = default_top_k if b.top_k is msgspec.UNSET else b.top_k
    if top_k is not None and top_k >= vocab:
        top_k = None  # the k largest of vocab ids, k >= vocab: every id, i.e. dense
    if top_k is not None and top_k > max_support:
        raise HttpError(422, "top_k_too_large",
                        f"top_k {top_k} above the negotiated support bound {max_support}")
    seed = b.seed if b.seed is not None else int.from_bytes(os.urandom(8), "little")
    return GenerateRequest(prompt=list(b.prompt_token_ids), max_tokens=b.max_tokens, seed=seed,
                           speculative=b.speculative, greedy=b.temperature == 0.0,
                           draft_temperature=b.draft_temperature, top_k=top_k)
