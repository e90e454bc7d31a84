"""Rational oracle for one standard verification round (docs/distribution.md).

Exact arithmetic throughout: every probability is a ``fractions.Fraction``. A
distribution is held as positive integer numerators over one common denominator
(``ExactDist``), which is the same rational vector as a list of Fractions, only faster
to sum and compare. Floats are converted exactly (a float64 is a dyadic rational); no
value is ever rounded unless a caller asks for the FP32 helper.

This is the authority the float64 reference path (pp1q.core.verify) and kernels are qualified
against. Speed is not a goal; small vocabularies are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from pp1q.core.errors import DistributionError, LocalProtocolError, Reason
from pp1q.core.q import MASS, DyadicRow
from pp1q.core.rng import U53_BITS, Domain, uniform53
from pp1q.core.verify import RoundDecision, RoundKeys

_U53_RANGE = 1 << U53_BITS


@dataclass(frozen=True)
class ExactDist:
    """A normalised categorical: p(ids[k]) = nums[k] / total, zero elsewhere in vocab."""

    vocab: int
    ids: tuple[int, ...]  # ascending, positive weight only
    nums: tuple[int, ...]  # positive integers
    total: int  # sum(nums) > 0

    def prob(self, token: int) -> Fraction:
        k = _index(self.ids, token)
        return Fraction(self.nums[k], self.total) if k is not None else Fraction(0)

    def probs(self) -> list[Fraction]:
        """Dense list of exact probabilities (length vocab)."""
        out = [Fraction(0)] * self.vocab
        for i, n in zip(self.ids, self.nums, strict=True):
            out[i] = Fraction(n, self.total)
        return out


def _index(ids: tuple[int, ...], token: int) -> int | None:
    lo, hi = 0, len(ids)
    while lo < hi:  # bisect without the key-function overhead
        mid = (lo + hi) // 2
        if ids[mid] < token:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < len(ids) and ids[lo] == token else None


def _exact(value) -> Fraction:
    if isinstance(value, Fraction):
        return value
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise DistributionError(Reason.NON_FINITE, f"weight {value}")
        return Fraction(float(value))  # exact: no rounding
    return Fraction(value)


def exact_dist(weights, vocab: int | None = None) -> ExactDist:
    """Normalise nonnegative weights exactly.

    ``weights``: a full sequence (length = vocab) or a sparse mapping {id: weight} /
    pair (ids, weights) with ``vocab`` given. Values: Fraction, int or float (exact).
    """
    if isinstance(weights, ExactDist):
        return weights
    if isinstance(weights, DyadicRow):
        return from_dyadic(weights)
    if isinstance(weights, Mapping):
        pairs = sorted(weights.items())
    elif isinstance(weights, tuple) and len(weights) == 2 and vocab is not None:
        pairs = sorted(zip((int(i) for i in weights[0]), weights[1], strict=True))
    else:
        values = list(np.asarray(weights).tolist()) if isinstance(weights, np.ndarray) else weights
        vocab = len(values) if vocab is None else vocab
        if len(values) != vocab:
            raise DistributionError(Reason.UNEXPECTED_SIZE, "full weights must cover vocab")
        pairs = list(enumerate(values))
    if vocab is None:
        raise DistributionError(Reason.UNEXPECTED_SIZE, "sparse weights need a vocab")
    ids, fracs = [], []
    for i, w in pairs:
        f = _exact(w)
        if f < 0:
            raise DistributionError(Reason.NEGATIVE_VALUE, f"weight {w} at {i}")
        if not 0 <= i < vocab:
            raise DistributionError(Reason.ID_OUT_OF_RANGE, f"id {i} outside [0, {vocab})")
        if ids and ids[-1] == i:
            raise DistributionError(Reason.DUPLICATE_ID, f"id {i} twice")
        ids.append(int(i))
        fracs.append(f)
    den = math.lcm(*(f.denominator for f in fracs)) if fracs else 1
    keep = [(i, f.numerator * (den // f.denominator)) for i, f in zip(ids, fracs, strict=True)]
    keep = [(i, n) for i, n in keep if n > 0]
    total = sum(n for _, n in keep)
    if total <= 0:
        raise DistributionError(Reason.ZERO_MASS, "weights have no mass")
    g = math.gcd(total, *(n for _, n in keep))
    return ExactDist(
        vocab=int(vocab),
        ids=tuple(i for i, _ in keep),
        nums=tuple(n // g for _, n in keep),
        total=total // g,
    )


def exact_from_fp32(weights, vocab: int | None = None) -> ExactDist:
    """Round each weight to FP32 first, then normalise those FP32 values exactly."""
    if isinstance(weights, Mapping):
        rounded = {int(i): float(np.float32(w)) for i, w in weights.items()}
        return exact_dist(rounded, vocab)
    return exact_dist(np.asarray(weights, dtype=np.float32).astype(np.float64), vocab)


def from_dyadic(row: DyadicRow) -> ExactDist:
    """The exact q of a dyadic24 row: counts / 2^24."""
    return ExactDist(
        vocab=row.vocab,
        ids=tuple(row.ids.tolist()),
        nums=tuple(row.counts.tolist()),
        total=MASS,
    )


# ---------------------------------------------------------------------------
# decisions


def exact_pick(dist: ExactDist, u53: int) -> int:
    """Smallest id j with C_j > (u53 / 2^53) * W, in integers (a zero weight never wins)."""
    if not 0 <= u53 < _U53_RANGE:
        raise DistributionError(Reason.DRAW_OUT_OF_RANGE, f"u53 {u53}")
    target = u53 * dist.total  # compare C_j * 2^53 > u53 * W
    acc = 0
    for i, n in zip(dist.ids, dist.nums, strict=True):
        acc += n
        if acc << U53_BITS > target:
            return i
    raise AssertionError("unreachable: u53 < 2^53 so the last cumulative sum wins")


def exact_accepts(u53: int, p_x: Fraction, q_x: Fraction) -> bool:
    """U = u53 / 2^53 < p(x) / q(x), strict (p = 0 never accepted)."""
    if not 0 <= u53 < _U53_RANGE:
        raise DistributionError(Reason.DRAW_OUT_OF_RANGE, f"u53 {u53}")
    if q_x <= 0:
        raise LocalProtocolError(Reason.ZERO_Q_AT_TOKEN, "q = 0 at a drafted token")
    return Fraction(u53, _U53_RANGE) < p_x / q_x


def residual(p: ExactDist, q: ExactDist) -> ExactDist | None:
    """max(p - q, 0) over the full vocabulary, normalised; None when it has no mass."""
    weights = {}
    for i, n in zip(p.ids, p.nums, strict=True):
        # p - q = (n * q.total - m * p.total) / (p.total * q.total); q = 0 off its support
        k = _index(q.ids, i)
        diff = n * q.total - (q.nums[k] * p.total if k is not None else 0)
        if diff > 0:
            weights[i] = diff
    if not weights:
        return None
    return exact_dist(weights, p.vocab)


@dataclass(frozen=True)
class RoundDraws:
    """Explicit 53-bit draws of one round: per position acceptance and correction, one bonus."""

    acceptance: tuple[int, ...]
    correction: tuple[int, ...]
    bonus: int

    @classmethod
    def from_keys(cls, keys: RoundKeys, depth: int) -> RoundDraws:
        """The contract's keyed draws, one scalar Philox call each (independent of verify)."""

        def u(pos: int, dom: Domain) -> int:
            return uniform53(keys.seed, keys.generation, keys.round_id, pos, dom)

        pos = [keys.first_position + i for i in range(depth)]
        return cls(
            acceptance=tuple(u(x, Domain.ACCEPTANCE) for x in pos),
            correction=tuple(u(x, Domain.CORRECTION) for x in pos),
            bonus=u(keys.first_position + depth, Domain.BONUS),
        )


def oracle_round(
    p_rows: Sequence, q_rows: Sequence, draft_ids: Sequence[int], draws: RoundDraws
) -> RoundDecision:
    """One fixed-depth round of standard verification in exact arithmetic.

    p_rows: D+1 target rows (any form ``exact_dist`` takes; normalised exactly here);
    q_rows: D draft rows (DyadicRow, ExactDist or weights); draft_ids: D tokens.
    Rows are converted lazily: only those the round reaches are touched.
    """
    depth = len(q_rows)
    if depth < 1 or len(p_rows) != depth + 1 or len(draft_ids) != depth:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "need D q rows, D drafts, D+1 p rows")
    if len(draws.acceptance) < depth or len(draws.correction) < depth:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "fewer draws than positions")
    for i in range(depth):
        p = exact_dist(p_rows[i])
        q = exact_dist(q_rows[i])
        x = int(draft_ids[i])
        if p.vocab != q.vocab or not 0 <= x < p.vocab:
            raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, f"draft {x} / vocab mismatch")
        if exact_accepts(draws.acceptance[i], p.prob(x), q.prob(x)):
            continue
        r = residual(p, q)
        # Rejection means p(x) < q(x), so sum(p - q)^+ = sum(q - p)^+ >= q(x) - p(x) > 0.
        assert r is not None, "exact residual mass is positive whenever a draft is rejected"
        return RoundDecision(i, exact_pick(r, draws.correction[i]), "correction")
    return RoundDecision(depth, exact_pick(exact_dist(p_rows[depth]), draws.bonus), "bonus")


def oracle_target_only(p, u53: int) -> int:
    """Target-only sampling: inverse-CDF pick over exactly normalised p."""
    return exact_pick(exact_dist(p), u53)


def processed_kept(P: Sequence[int], top_k: int | None, top_p: float | None) -> list[int]:
    """Ids (ascending) that top-k then top-p keep of the fixed-point row ``P`` (integers),
    by a full sort: the one-process form of pp1q_kernels.shard_processors' rule. Ids in
    descending P order, ties lowest id first; top-k keeps the first k; top-p keeps id j
    of those when the mass before it over their total is < top_p, compared as Fractions."""
    order = sorted(range(len(P)), key=lambda i: (-int(P[i]), i))
    kept = order if top_k is None else order[:top_k]
    if top_p is not None:
        total = sum(int(P[i]) for i in kept)
        bound = Fraction(top_p)
        out, before = [], 0
        for i in kept:
            if Fraction(before, total) < bound:
                out.append(i)
            before += int(P[i])
        kept = out
    return sorted(kept)
