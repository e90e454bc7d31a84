"""Top-k and top-p across vocabulary shards, in exact integers: no rank holds a row.

The rule, on a fixed-point target row P = floor(p * 2^61) (p after the temperature;
its one-process form is pp1q.core.reference.processed_kept): order the ids by P
descending, ties lowest id first; top-k keeps the first k; top-p keeps, of those, id j
when the mass strictly before it is below top_p times their total S_k, i.e.
before_j < B with B = ceil(top_p * S_k), computed exactly from top_p's binary fraction.
Kept entries keep their P, the rest become 0: the renormalised row is P / S with S the
kept total, the division the sampler already does (shard_step). All of it is integers,
so every split of the vocabulary keeps the same ids.

Every prefix of that order is "P > v, and the first t ids (lowest first) with P == v"
for a boundary value v and tie count t. Ranks own contiguous ids in rank order, so the t
tied ids go to the ranks in rank order, each taking its lowest tied ids (``_share``).

- top-k: each rank's min(k, width) largest P (padded with -1) are gathered,
  [N, rows, k]; v is the k-th largest of them (every P > v of a rank is among its k
  largest: fewer than k exceed v in all), t = k - #(P > v). A rank's tied count can be
  cut off at its k, but then it is at least the room left, so the shares are the same.
- top-p after top-k: every kept value is in that gather; v and t follow from it.
- top-p alone: S by one Sum, then v = max{v : mass(P >= v) >= B} by a radix select:
  one all-reduced histogram of mass per binade ([rows, LENGTHS] int64) finds v's
  binade, then RADIX_PASSES histograms of mass per 8-bit digit ([rows, BINS]) over the
  entries of that binade only (a few percent of a row: the passes cost little), then
  one gather of each rank's count of P == v: t = ceil((B - A) / v) with A the mass
  above v (the i-th tied id has A + i * v before it).

Collective sizes do not grow with the vocabulary: rows x k (k <= MAX_SHARD_TOP_K) for
top-k, rows x BINS for top-p's passes, rows for the tie counts.
"""

from __future__ import annotations

import torch

from pp1q.core.errors import DistributionError, LocalProtocolError, Reason

from .shard_spmd import Gather, Place, Step, Sum

MAX_SHARD_TOP_K = 1024  # each rank gathers k values per row: 8 KiB a row at most, a few
#                         hundred times less than one 129280-id row of int64
RADIX_BITS = 8  # top-p's select: 256-bin histograms (2 KiB a row), 8 passes for 64 bits
BINS = 1 << RADIX_BITS
RADIX_PASSES = 64 // RADIX_BITS
LENGTHS = 64  # top-p's first pass: mass per binade of P (< 2^63: bit lengths 0..63)
_PAD = -1  # below every P >= 0: a rank with fewer than k ids pads its candidates


def check(top_k: int | None, top_p: float | None, vocab: int) -> None:
    """Refuse what this rule cannot apply exactly (every rank alike, before any collective);
    k >= vocab keeps every id, whatever its size."""
    if top_k is not None and not (1 <= top_k <= MAX_SHARD_TOP_K or top_k >= vocab >= 1):
        raise LocalProtocolError(Reason.UNSUPPORTED_FEATURE,
                                 f"sharded top_k {top_k}: at most {MAX_SHARD_TOP_K}")
    if top_p is not None and not 0.0 < float(top_p) <= 1.0:
        raise DistributionError(Reason.BAD_TOP_P, f"top_p {top_p!r}")


def _ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for integers, b > 0 (floor division of the negation, exact)."""
    return -((-a) // b)


def nucleus_bound(top_p: float, total: int) -> int:
    """B = ceil(top_p * total), exact: before_j < top_p * total iff before_j < B."""
    num, den = float(top_p).as_integer_ratio()
    return _ceil_div(num * int(total), den)


def _share(counts: torch.Tensor, t: int) -> torch.Tensor:
    """The first t tied ids by rank, each rank's ``counts`` in rank order: its share."""
    before = counts.cumsum(0) - counts
    return (t - before).clamp(min=0).minimum(counts)


def _mask(P: torch.Tensor, v: torch.Tensor, take: torch.Tensor) -> torch.Tensor:
    """P [n, width] with P > v kept, the first ``take`` of P == v kept, the rest zeroed."""
    tied = v.unsqueeze(-1) == P
    keep = (v.unsqueeze(-1) < P) | (tied & (tied.cumsum(-1) <= take.unsqueeze(-1)))
    return torch.where(keep, P, torch.zeros_like(P))


def _nucleus_of(kept: torch.Tensor, top_p: float) -> tuple[int, int]:
    """(v, t) of top-p over the values ``kept`` (descending, the whole kept multiset)."""
    total = int(kept.sum())
    if total <= 0:
        raise DistributionError(Reason.ZERO_MASS, "target row has no mass at 2^-61")
    B = nucleus_bound(top_p, total)
    at = int((kept.cumsum(0) < B).sum())  # the first position whose running mass >= B
    v = int(kept[at])
    above = int(kept[kept > v].sum())
    return v, _ceil_div(B - above, v)  # tied ids needed: the i-th has above + i v before it


def top_k_step(place: Place, P: torch.Tensor, k: int, top_p: float | None) -> Step:
    """P [n, width] after top-k (and top-p over its kept ids), by one gather."""
    n = P.shape[0]
    kk = min(k, place.vocab)
    mine = torch.full((n, kk), _PAD, dtype=torch.int64)
    m = min(kk, place.width)
    if m:
        mine[:, :m] = torch.topk(P, m, dim=-1).values
    every = yield Gather(mine)  # [N, n, kk]
    vs, takes = [], []
    for r in range(n):
        vals = every[:, r, :]  # [N, kk]
        flat = vals.flatten().sort(descending=True).values
        v = int(flat[kk - 1])  # >= 0: the ranks hold vocab >= kk real values
        above = (vals > v).sum(-1)
        share = _share((vals == v).sum(-1), kk - int(above.sum()))
        if top_p is not None:
            kept = torch.cat([flat[flat > v], flat.new_full((int(share.sum()),), v)])
            vp, t = _nucleus_of(kept, top_p)
            share = _share(share if vp == v else (vals == vp).sum(-1), t)
            v = vp
        vs.append(v)
        takes.append(int(share[place.rank]))
    return _mask(P, torch.tensor(vs, dtype=torch.int64), torch.tensor(takes, dtype=torch.int64))


def _binade(v: torch.Tensor) -> torch.Tensor:
    """0..63 per int64 value 0 <= v < 2^63: the bit length of float64(v). Not always v's
    own (rounding to 53 bits can carry v up to the next power of two), but rounding is
    monotone, so each bin is a contiguous range of values in order: all a select needs."""
    return ((v.to(torch.float64).view(torch.int64) >> 52) - 1022).clamp(min=0)


def _past(suffix: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """suffix[r, b_r + 1] (0 past the last bin): the mass above bin b_r of each row."""
    padded = torch.cat([suffix[:, 1:], suffix.new_zeros(suffix.shape[0], 1)], -1)
    return padded.gather(1, b.unsqueeze(-1)).squeeze(-1)


def top_p_step(place: Place, P: torch.Tensor, top_p: float) -> Step:
    """P [n, width] after top-p alone: a radix select of the boundary value."""
    n = P.shape[0]
    S = yield Sum(P.sum(-1))
    if bool((S <= 0).any()):  # every rank sees the same totals: all refuse together
        raise DistributionError(Reason.ZERO_MASS, "target row has no mass at 2^-61")
    B = torch.tensor([nucleus_bound(top_p, int(s)) for s in S], dtype=torch.int64)
    # first v's binade, by one histogram of mass per binade; only the entries of that
    # binade take part in the digit passes below
    row = torch.arange(n).repeat_interleave(P.shape[1])
    val = P.flatten()
    length = _binade(val)
    hist = torch.zeros(n * LENGTHS, dtype=torch.int64)
    hist.scatter_add_(0, row * LENGTHS + length, val)
    hist = yield Sum(hist.view(n, LENGTHS))
    suffix = hist.flip(-1).cumsum(-1).flip(-1)  # mass in this binade or above
    top = (suffix >= B.unsqueeze(-1)).sum(-1) - 1  # the highest binade still reaching B
    above = _past(suffix, top)  # the mass of P above v's binade (< B)
    inside = length == top[row]
    row, val = row[inside], val[inside]
    pre = torch.zeros(n, dtype=torch.int64)  # the digits of v chosen so far
    for k in range(RADIX_PASSES):
        shift = 64 - RADIX_BITS * (k + 1)
        digit = (val >> shift) & (BINS - 1)
        hist = torch.zeros(n * BINS, dtype=torch.int64)
        hist.scatter_add_(0, row * BINS + digit, val)
        hist = yield Sum(hist.view(n, BINS))  # mass of the range per next digit
        suffix = hist.flip(-1).cumsum(-1).flip(-1)  # mass at this digit or above
        # the largest digit whose mass at or above it still reaches B (suffix falls)
        b = (suffix >= (B - above).unsqueeze(-1)).sum(-1) - 1
        above = above + _past(suffix, b)
        pre = (pre << RADIX_BITS) | b
        inside = digit == b[row]
        row, val = row[inside], val[inside]
    counts = yield Gather((pre.unsqueeze(-1) == P).sum(-1))  # [N, n] tied ids per rank
    takes = []
    for r in range(n):
        t = _ceil_div(int(B[r]) - int(above[r]), int(pre[r]))  # ties needed, v >= 1
        takes.append(int(_share(counts[:, r], t)[place.rank]))
    return _mask(P, pre, torch.tensor(takes, dtype=torch.int64))


def processed(place: Place, P: torch.Tensor, top_k: int | None,
              top_p: float | None) -> Step:
    """P [n, width] (this rank's fixed-point rows) after top-k then top-p; as it is
    when neither applies (k >= vocab keeps every id, top_p = 1 too)."""
    check(top_k, top_p, place.vocab)
    if top_p is not None and float(top_p) >= 1.0:
        top_p = None
    if top_k is not None and top_k < place.vocab:
        return (yield from top_k_step(place, P, top_k, top_p))
    if top_p is not None:
        return (yield from top_p_step(place, P, top_p))
    return P
