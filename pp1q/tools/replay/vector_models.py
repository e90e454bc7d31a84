"""A BLAS-free toy pair for the checked-in capture vectors (tests/data/*.pp1qcap).

The embedded toy pair (pp1q.models.toy) multiplies FP32 embeddings through BLAS, whose
rounding differs between CPUs; a q row built from such logits could differ in a count
on another machine, and the vectors would no longer regenerate byte for byte. Here
every logit is a small multiple of 1/16 computed from integer hashes, exact in FP64 on
any machine; only the softmax's exp remains platform arithmetic.

    target(v | c2, c1) = T1[c1, v] / 4 + T2[c2, v] / 8
    drafter row i      = T1[x_{i-1}, v] / 4 + T2[c2 if known, v] / 8 + NOISE * N[v]

T1, T2, N are tables of hashed integers in [0, LEVELS). Like the toy pair, the drafter
knows the second-to-last context token only for positions 1 and 2, and its unigram
noise makes it disagree with the target often enough to exercise rejections.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pp1q.models.toy import DraftModel, TargetModel

LEVELS = 32  # hashed integers in [0, 32): logits spread over about 8 + 4 nats
NOISE = 0.0625  # weight of the drafter's unigram noise (a power of two: stays exact)
TARGET_PREFIX = "exact-toy-target-v1"
DRAFT_PREFIX = "exact-toy-draft-v1"
_NONE = -1  # context token not known (prefix too short, or beyond the backbone's reach)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic, exact everywhere)."""
    with np.errstate(over="ignore"):
        x = (x + _GOLDEN) & np.uint64(0xFFFFFFFFFFFFFFFF)
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


class _Tables:
    def __init__(self, vocab: int, seed: int) -> None:
        self.vocab, self.seed = vocab, seed
        self._ids = np.arange(vocab, dtype=np.uint64)

    def table(self, tag: int, ctx: int) -> np.ndarray:
        """Row ``ctx`` of table ``tag``: FP64 integers in [0, LEVELS), one per token."""
        base = _mix(np.array([self.seed * 1_000_003 + tag * 7919 + ctx + 1], dtype=np.uint64))
        return (_mix(self._ids ^ base) % np.uint64(LEVELS)).astype(np.float64)

    def t1(self, c1: int) -> np.ndarray:
        return self.table(1, c1) / 4

    def t2(self, c2: int) -> np.ndarray:
        return self.table(2, c2) / 8


class VectorTarget(TargetModel):
    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.vocab = vocab
        self.identity = f"{TARGET_PREFIX}:vocab={vocab}:seed={seed}"
        self._t = _Tables(vocab, seed)

    def logits(self, prefix: Sequence[int], draft: Sequence[int]) -> np.ndarray:
        ctx = [int(t) for t in prefix] + [int(t) for t in draft]
        n0 = len(prefix)
        rows = []
        for i in range(len(draft) + 1):
            end = n0 + i
            c1 = ctx[end - 1] if end >= 1 else _NONE
            c2 = ctx[end - 2] if end >= 2 else _NONE
            rows.append(self._t.t1(c1) + self._t.t2(c2))
        return np.stack(rows)


class VectorDrafter(DraftModel):
    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.vocab = vocab
        self.identity = f"{DRAFT_PREFIX}:vocab={vocab}:seed={seed}"
        self.target_identity = f"{TARGET_PREFIX}:vocab={vocab}:seed={seed}"
        self._t = _Tables(vocab, seed)
        self._noise = NOISE * self._t.table(3, 0)

    def backbone(self, prefix: Sequence[int], depth: int) -> np.ndarray:
        rows = []
        for i in range(1, depth + 1):
            # x_{i-2}: prefix[-2] for i = 1, prefix[-1] for i = 2, unknown after that
            k = 3 - i
            c2 = int(prefix[-k]) if i <= 2 and len(prefix) >= k else _NONE
            rows.append(self._t.t2(c2) + self._noise)
        return np.stack(rows)

    def markov_bias(self, prev_token: int | None) -> np.ndarray:
        return self._t.t1(_NONE if prev_token is None else int(prev_token))


def parse_identity(target_id: str) -> tuple[str, int, int] | None:
    """``name:vocab=V:seed=S`` -> (name, V, S); None for any other shape."""
    name, *kv = target_id.split(":")
    fields = dict(p.partition("=")[::2] for p in kv)
    try:
        return name, int(fields["vocab"]), int(fields["seed"])
    except (KeyError, ValueError):
        return None
