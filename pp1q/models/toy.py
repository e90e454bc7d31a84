"""Draft and target model interfaces, and the embedded seeded toy pair.

``DraftModel`` has the DSpark shape: a parallel backbone gives logits for every draft
position from the committed prefix alone, and a serial low-rank Markov head adds a bias
from the previously *sampled* token. Row i of a proposal is therefore
``backbone(prefix)[i] + markov_bias(x_{i-1})`` (x_0 = last committed token), and the
worker must sample x_{i-1} before it can build row i.

``TargetModel.logits(prefix, draft)`` returns the target logits for positions
1..len(draft)+1 in one call: row i is conditioned on the prefix and draft[:i]. The
target's p is the FP64 softmax of those logits at T = 1 (``TargetModel.probs``).

The toy pair is a rank-r bilinear model over hash-seeded embeddings, cheap at the
DeepSeek vocabulary (about 1 ms per row at 129280):

    target(next | ..., c2, c1) = bias + s * E_out . (E_in[c1] + a * E_in[c2])
    drafter row i              = bias + s * E_out . (E_in[x_{i-1}] + a * E_in[c2 if known])

The drafter's Markov head is exactly the target's bigram term, and its backbone knows
the second-to-last token only while it is still in the committed prefix (positions 1
and 2), so even the matched drafter drifts from the target from position 3 on. The
``distance`` knob blends in an independent bigram model; ``adversarial`` negates the
drafter's logits (the heavy-rejection regime that exposes shared-noise bugs).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_VOCAB = 129280  # the DeepSeek-V3 tokenizer
MIN_VOCAB = 2  # a categorical needs at least two outcomes to be worth sampling
MAX_VOCAB = 1 << 20  # toy embeddings are V x rank floats; bound the start-up memory
TOY_RANK = 16  # low rank keeps a 129280-token row near 1 ms
TOY_SECOND_ORDER = 0.25  # weight a of the second-to-last token in the toy context
TOY_SHARPNESS = 1.0  # logit scale as a fraction of sqrt(2 ln V): entropy about 3.5 nats at V=129280

# name -> (distance, adversarial)
DRAFT_PRESETS = {
    "matched": (0.0, False),
    "close": (0.1, False),
    "far": (0.4, False),
    "independent": (1.0, False),
    "adversarial": (0.0, True),
}
DEFAULT_DRAFT_PRESET = "close"


def softmax64(logits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Row-wise FP64 softmax at T = 1 (-inf entries get probability 0); ``out`` may be a
    preallocated float64 buffer of the same shape (the verifier's slot buffers)."""
    x = np.asarray(logits, dtype=np.float64)
    z = np.subtract(x, x.max(axis=-1, keepdims=True), out=out)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def vocab_map_id(vocab: int) -> str:
    """Identity of the global id map: toy models use ids 0..vocab-1 verbatim."""
    return f"identity-ids:{vocab}"


class DraftModel(abc.ABC):
    """A drafter: parallel backbone rows plus a serial Markov bias."""

    vocab: int
    identity: str  # this checkpoint, for HELLO
    target_identity: str  # the target this drafter was built for; HELLO pairs the two
    variant: str = ""  # run-time knobs that change q but not the checkpoint (metrics only)

    @abc.abstractmethod
    def backbone(self, prefix: Sequence[int], depth: int) -> np.ndarray:
        """FP64 logits [depth, vocab] for draft positions 1..depth, from the prefix only."""

    @abc.abstractmethod
    def markov_bias(self, prev_token: int) -> np.ndarray:
        """FP64 logit bias [vocab] from the previously sampled (or last committed) token."""

    def row_logits(self, backbone_row: np.ndarray, prev_token: int) -> np.ndarray:
        return backbone_row + self.markov_bias(prev_token)


class TargetModel(abc.ABC):
    """A target: logits for positions 1..len(draft)+1 in one call."""

    vocab: int
    identity: str

    @abc.abstractmethod
    def logits(self, prefix: Sequence[int], draft: Sequence[int]) -> np.ndarray:
        """FP64 logits [len(draft) + 1, vocab]; row i sees prefix + draft[:i]."""

    def probs(self, prefix: Sequence[int], draft: Sequence[int],
              out: np.ndarray | None = None) -> np.ndarray:
        """The target's p: FP64 softmax at T = 1 of ``logits`` (into ``out`` if given)."""
        return softmax64(self.logits(prefix, draft), out)


@dataclass(frozen=True)
class ToySpec:
    """What identifies the toy pair: both ends must agree on vocab and seed."""

    vocab: int = DEFAULT_VOCAB
    seed: int = 0

    def __post_init__(self) -> None:
        if not MIN_VOCAB <= int(self.vocab) <= MAX_VOCAB:
            raise ValueError(f"vocab {self.vocab} outside [{MIN_VOCAB}, {MAX_VOCAB}]")
        if not 0 <= int(self.seed) < 1 << 63:
            raise ValueError(f"model seed {self.seed} outside [0, 2^63)")

    @property
    def target_identity(self) -> str:
        return f"toy-target-v1:vocab={self.vocab}:seed={self.seed}"

    @property
    def draft_identity(self) -> str:
        """The drafter checkpoint (its distance knob is a variant, see ToyDrafter.variant)."""
        return f"toy-dspark-v1:vocab={self.vocab}:seed={self.seed}"


class _ToyWeights:
    """Hash-seeded embeddings shared by the toy target and drafter (one per spec/tag)."""

    def __init__(self, spec: ToySpec, tag: int) -> None:
        rng = np.random.default_rng(np.random.SeedSequence([spec.seed, tag, spec.vocab]))
        v, r = spec.vocab, TOY_RANK
        self.e_in = (rng.standard_normal((v, r)) / math.sqrt(r)).astype(np.float32)
        self.e_out = rng.standard_normal((v, r)).astype(np.float32)
        # A mild Zipf-like unigram prior over a shuffled order of the ids.
        rank = rng.permutation(v).astype(np.float64)
        self.bias = -0.5 * np.log1p(rank)
        self.scale = TOY_SHARPNESS * math.sqrt(2.0 * math.log(v))
        self.e_out_scaled = self.e_out * np.float32(self.scale)  # s * E_out, one product later
        self.e_out_t = np.ascontiguousarray(self.e_out_scaled.T)  # [r, V] for project
        self.zero = np.zeros(r, dtype=np.float32)

    def embed(self, token: int | None) -> np.ndarray:
        return self.zero if token is None else self.e_in[token]

    def project(self, h: np.ndarray) -> np.ndarray:
        """bias + s * E_out . h for h of shape [r, n] -> [n, vocab] (FP32 product, FP64 sum)."""
        return project_rows(h, self.e_out_t, self.bias)


def project_rows(h: np.ndarray, out: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """bias + h.T . out: h [r, n], out [r, width] -> FP64 [n, width], every entry summed
    in one order whatever n and whatever columns ``out`` holds: term by term over r, each
    a float32 product added to a float32 sum. An sgemm picks its kernel by the shape, so
    a round's row i (D + 1 rows scored) and the target-only step's one row differed by
    float32 roundings (3.8e-6 in a logit on an Intel Xeon): the speculative path and
    target-only sampling read different p for the same prefix. A vocabulary shard's
    columns equal the whole row's the same way (pp1q.verifier.ranks.shard_target)."""
    rows = np.ascontiguousarray(h.T)  # [n, r]: the same strides for any n
    if out.shape[1] > 1:  # einsum's own loop (not BLAS) runs along the columns, adding
        return np.add(np.einsum("ir,rv->iv", rows, out), bias)  # the terms in r order
    # one column: einsum drops the axis and sums each dot product in an order of its
    # own (a one-id shard of a tiny vocabulary differed from the whole row)
    total = rows[:, :1] * out[0]
    for k in range(1, out.shape[0]):
        total += rows[:, k:k + 1] * out[k]
    return np.add(total, bias)


def context_columns(embed, prefix: Sequence[int], draft: Sequence[int]) -> np.ndarray:
    """The toy target's hidden state h [r, len(draft) + 1] before each scored position:
    the last token's input embedding plus TOY_SECOND_ORDER times the one before it (the
    whole-row target and a vocabulary shard of it project the same h)."""
    ctx = [int(t) for t in prefix[-2:]] + [int(t) for t in draft]
    n0 = min(len(prefix), 2)
    cols = []
    for i in range(len(draft) + 1):
        end = n0 + i
        c1 = ctx[end - 1] if end >= 1 else None
        c2 = ctx[end - 2] if end >= 2 else None
        cols.append(embed(c1) + TOY_SECOND_ORDER * embed(c2))
    return np.stack(cols, axis=1)


def _tail(prefix: Sequence[int], k: int) -> int | None:
    return int(prefix[-k]) if len(prefix) >= k else None


class ToyTarget(TargetModel):
    def __init__(self, spec: ToySpec) -> None:
        self.spec = spec
        self.vocab = spec.vocab
        self.identity = spec.target_identity
        self._w = _ToyWeights(spec, tag=1)

    def logits(self, prefix: Sequence[int], draft: Sequence[int]) -> np.ndarray:
        return self._w.project(context_columns(self._w.embed, prefix, draft))


class ToyDrafter(DraftModel):
    """A seeded DSpark-like drafter for ``ToyTarget(spec)``.

    ``distance`` in [0, 1] blends the ideal drafter with an independent seeded bigram
    model (1 = independent); ``adversarial`` negates the blended logits.
    """

    def __init__(self, spec: ToySpec, distance: float = 0.25, adversarial: bool = False) -> None:
        if not (0.0 <= float(distance) <= 1.0):
            raise ValueError(f"draft distance {distance} outside [0, 1]")
        self.spec = spec
        self.vocab = spec.vocab
        self.distance = float(distance)
        self.adversarial = bool(adversarial)
        self.target_identity = spec.target_identity
        self.identity = spec.draft_identity
        self.variant = f"distance={self.distance:g}:adversarial={int(self.adversarial)}"
        ideal = _ToyWeights(spec, tag=1)  # the target's own weights
        noise = _ToyWeights(spec, tag=2)  # an unrelated bigram model
        sign = -1.0 if self.adversarial else 1.0
        keep, mix = sign * (1.0 - self.distance), sign * self.distance
        # Folded once: the blend of both models is one low-rank product per row.
        self._ideal = ideal
        self._backbone_out = (ideal.e_out_scaled * np.float32(keep)).T.copy()  # [r, V]
        self._backbone_bias = keep * ideal.bias + mix * noise.bias
        self._markov_in = (ideal.e_in, noise.e_in)
        self._markov_out = np.hstack([ideal.e_out_scaled * np.float32(keep),
                                      noise.e_out_scaled * np.float32(mix)])  # [V, 2r]
        self._markov_zero = np.zeros(2 * TOY_RANK, dtype=np.float32)

    @classmethod
    def preset(cls, spec: ToySpec, name: str) -> ToyDrafter:
        if name not in DRAFT_PRESETS:
            raise ValueError(f"unknown draft preset {name!r}; known: {', '.join(DRAFT_PRESETS)}")
        distance, adversarial = DRAFT_PRESETS[name]
        return cls(spec, distance=distance, adversarial=adversarial)

    def backbone(self, prefix: Sequence[int], depth: int) -> np.ndarray:
        # Position i's second-to-last context token is x_{i-2}: known from the prefix
        # only for i <= 2 (i = 1: prefix[-2], i = 2: prefix[-1]).
        w = self._ideal
        cols = np.stack([TOY_SECOND_ORDER * w.embed(_tail(prefix, 2 - i + 1) if i <= 2 else None)
                         for i in range(1, depth + 1)])
        # each row the same bits however many are asked for (project_rows; with an sgemm
        # row i of 4 rows and of 8 differed on an AMD EPYC), so the engine seam's drafter
        # (pp1q.models.toy_engine), which asks for more rows, drafts the same q
        return project_rows(cols.T, self._backbone_out, self._backbone_bias)

    def markov_bias(self, prev_token: int | None) -> np.ndarray:
        if prev_token is None:
            h = self._markov_zero
        else:
            h = np.concatenate([e[prev_token] for e in self._markov_in])
        return (self._markov_out @ h).astype(np.float64)


def toy_pair(vocab: int = DEFAULT_VOCAB, seed: int = 0, preset: str = DEFAULT_DRAFT_PRESET,
             distance: float | None = None) -> tuple[ToyDrafter, ToyTarget]:
    """The embedded default pair; ``distance`` overrides the preset's distance."""
    spec = ToySpec(vocab=vocab, seed=seed)
    drafter = ToyDrafter.preset(spec, preset)
    if distance is not None:
        drafter = ToyDrafter(spec, distance=distance, adversarial=drafter.adversarial)
    return drafter, ToyTarget(spec)
