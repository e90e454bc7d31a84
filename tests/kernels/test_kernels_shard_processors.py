"""Top-k and top-p across vocabulary shards (kernels/shard_processors) keep the ids of
the one-process rule (pp1q.core.reference.processed_kept), which keeps the ids of
pp1q.models.processors on rows away from float rounding boundaries.

The rule is on integers, so the sharded comparison is exact on any row: the rows here
are made of few distinct values (ties at every boundary, running masses landing exactly
on top_p). The float comparison needs rows where float64 rounding cannot decide: see
``clear_rows``. Planted bugs (ties highest id first, top-p keeping mass <= instead of <,
each rank choosing its top-k from its own shard) are rejected by the same comparisons.
"""

from fractions import Fraction

import numpy as np
import pytest
import torch

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.reference import processed_kept
from pp1q.models.processors import processed_probs
from pp1q_kernels import shard_processors as sp
from pp1q_kernels import shard_step as ss
from pp1q_kernels.fixed import to_fixed
from pp1q_kernels.shard_comm import ShardLayout
from pp1q_kernels.shard_spmd import CollectiveLog, Gather, deliver, simulate

SETTINGS = [(None, 0.5), (1, None), (3, None), (5, 0.3), (4, 0.9), (None, 0.1),
            (None, 0.75), (7, None), (2, 1.0), (None, 0.999)]


def splits(vocab: int):
    """One rank, two uneven, three uneven with a one-id shard."""
    return [ShardLayout(vocab, ((0, vocab),)), ShardLayout.cuts(vocab, [vocab // 3]),
            ShardLayout.cuts(vocab, [vocab // 2, vocab // 2 + 1])]


def sharded(layout, P: torch.Tensor, top_k, top_p, **kw) -> torch.Tensor:
    """The kept P of rows P [n, V] over ``layout``'s simulated ranks."""
    out = simulate(layout.bounds, lambda pl: sp.processed(pl, P[:, pl.lo:pl.hi], top_k, top_p),
                   **kw)
    return torch.cat(out, -1)


def kept_of(rule, P: torch.Tensor, top_k, top_p) -> list[list[int]]:
    """Per row, the ids ``rule`` keeps that have mass (zero P is zero either way)."""
    return [[i for i in rule(row.tolist(), top_k, top_p) if row[i] > 0] for row in P]


def ties_highest_first(P, top_k, top_p):  # planted: the boundary's ties go high id first
    flipped = processed_kept(P[::-1], top_k, top_p)
    return sorted(len(P) - 1 - i for i in flipped)


def nucleus_le(P, top_k, top_p):  # planted: keeps id j when the mass before it <= top_p
    order = sorted(range(len(P)), key=lambda i: (-P[i], i))[:top_k]
    if top_p is None:
        return sorted(order)
    total, before, out = sum(P[i] for i in order), 0, []
    for i in order:
        if Fraction(before, total) <= Fraction(top_p):
            out.append(i)
        before += P[i]
    return sorted(out)


def tied_rows(seed: int, n: int = 40, vocab: int = 11) -> torch.Tensor:
    """Rows of a few distinct values: ties at every boundary, exact top_p hits."""
    g = np.random.default_rng(seed)
    rows = [g.choice([0, 1, 2, 4, 4, 8], vocab) for _ in range(n)]
    rows += [np.full(vocab, 4), np.arange(vocab) % 3, (np.arange(vocab) < 5) * 6]
    P = torch.tensor(np.array(rows), dtype=torch.int64) << 50
    return P[P.sum(-1) > 0]


def mismatches(P, top_k, top_p, rule, layout) -> int:
    got = sharded(layout, P, top_k, top_p)
    want = kept_of(rule, P, top_k, top_p)
    bad = 0
    for r in range(P.shape[0]):
        ids = (got[r] > 0).nonzero().flatten().tolist()
        bad += ids != want[r] or not torch.equal(got[r, ids], P[r, ids])
    return bad


@pytest.mark.parametrize(("top_k", "top_p"), SETTINGS)
def test_every_split_keeps_the_reference_ids(top_k, top_p):
    P = tied_rows(3)
    for layout in splits(P.shape[1]):
        assert mismatches(P, top_k, top_p, processed_kept, layout) == 0


def test_values_where_float_rounding_carries_to_the_next_binade():
    # 2^55 - 1 rounds to 2^55 as a float64: top-p's first pass bins by the float's
    # exponent, which must still order the values exactly (the digit passes are exact)
    edge = [(1 << 55) - 1, 1 << 55, (1 << 55) + 1, (1 << 54) - 1, 1 << 54, (1 << 56) - 3,
            (1 << 53) + 1, 3]
    g = np.random.default_rng(8)
    P = torch.tensor(np.array([g.choice(edge, 9) for _ in range(30)]), dtype=torch.int64)
    for top_p in (0.2, 0.5, 0.8, 0.95):
        for layout in splits(9):
            assert mismatches(P, None, top_p, processed_kept, layout) == 0


def test_exact_boundaries():
    P = torch.full((1, 4), 4 << 40)  # four equal ids: mass before them 0, 1/4, 1/2, 3/4
    for layout in splits(4):
        kept = sharded(layout, P, None, 0.5)[0]  # before < 1/2: ids 0 and 1, not 2
        assert (kept > 0).tolist() == [True, True, False, False]
        kept = sharded(layout, P, 3, 0.75)[0]  # over the top 3: 0, 1/3, 2/3 < 3/4
        assert (kept > 0).tolist() == [True, True, True, False]
        kept = sharded(layout, P, 2, None)[0]  # ties lowest id first, across shards
        assert (kept > 0).tolist() == [True, True, False, False]


def test_planted_rules_are_rejected():
    P = tied_rows(4)
    layout = splits(P.shape[1])[2]
    assert sum(mismatches(P, k, t, ties_highest_first, layout) for k, t in SETTINGS) > 10
    assert sum(mismatches(P, k, t, nucleus_le, layout) for k, t in SETTINGS) > 5


def own_shard_top_k(reqs):
    """Planted bug: the top-k gather hands each rank only its own candidates (each rank
    keeps its own k: N * k ids kept, the local-normalisation family of bugs)."""
    out = deliver(reqs)
    if isinstance(reqs[0], Gather) and reqs[0].t.dim() == 2:
        for r in range(len(reqs)):
            others = torch.ones(len(reqs), dtype=torch.bool)
            others[r] = False
            out[r][others] = -1
    return out


def test_each_rank_choosing_its_own_top_k_is_rejected():
    P = tied_rows(5)
    layout = splits(P.shape[1])[2]
    got = sharded(layout, P, 3, None, collective=own_shard_top_k)
    want = kept_of(processed_kept, P, 3, None)
    assert sum((got[r] > 0).nonzero().flatten().tolist() != want[r]
               for r in range(P.shape[0])) > 10


MARGIN = 1e-9  # float64 p and the fixed-point P differ by ~1e-15 relative: never decides


def clear_rows(seed: int, temperature: float, top_k, top_p, vocab: int = 60, n: int = 30):
    """(logits, P) rows where float rounding cannot decide the kept set: logits are
    multiples of 1/8 in [-6, 6] (distinct values differ by >= 1/8 / T in log p, equal
    ones give bit-equal p on both paths), and rows where the exact mass before any id
    in order is within MARGIN of top_p are skipped (a float cumsum could fall either
    side). Returns the rows kept and how many were skipped."""
    g = np.random.default_rng(seed)
    logits = torch.tensor(np.round(g.uniform(-6, 6, (n, vocab)) * 8) / 8)
    logits[::3, : vocab // 2] = logits[::3, :1]  # heavy exact ties in every third row
    layout = splits(vocab)[0]
    p = simulate(layout.bounds, lambda pl: ss.probs(pl, logits / temperature))[0]
    P = to_fixed(p)
    keep = []
    for r in range(n):
        order = sorted(range(vocab), key=lambda i: (-int(P[r, i]), i))[:top_k]
        total, before, near = sum(int(P[r, i]) for i in order), 0, False
        for i in order:
            near |= top_p is not None and abs(before / total - top_p) < MARGIN
            before += int(P[r, i])
        keep.append(not near)
    keep = torch.tensor(keep)
    return logits[keep], P[keep], int((~keep).sum())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize(("top_k", "top_p"), [(None, 0.5), (5, None), (20, 0.8), (None, 0.95),
                                              (35, None), (40, 0.3)])
def test_the_integer_rule_keeps_the_processors_ids(temperature, top_k, top_p):
    logits, P, skipped = clear_rows(9, temperature, top_k, top_p)
    assert skipped <= 3 and logits.shape[0] >= 27
    float_kept = [(row > 0).nonzero().flatten().tolist()
                  for row in processed_probs(logits, temperature, top_k, top_p)]
    assert kept_of(processed_kept, P, top_k, top_p) == float_kept
    # and the sharded rule on the same rows
    layout = splits(P.shape[1])[2]
    got = sharded(layout, P, top_k, top_p)
    assert [(row > 0).nonzero().flatten().tolist() for row in got] == float_kept
    if top_k is not None:  # the tied rows put ties at the top-k boundary: the rule shows
        assert kept_of(ties_highest_first, P, top_k, top_p) != float_kept


def test_collectives_do_not_grow_with_the_vocabulary():
    vocab, n = 6000, 4
    g = np.random.default_rng(2)
    P = to_fixed(torch.softmax(torch.tensor(g.normal(0, 2, (n, vocab))), -1))
    layout = ShardLayout.cuts(vocab, [1000, 3500])
    widest = max(hi - lo for lo, hi in layout.bounds)
    for top_k, top_p, count, largest in [(50, None, 1, n * 50), (50, 0.9, 1, n * 50),
                                         (None, 0.9, 3 + sp.RADIX_PASSES, n * sp.BINS)]:
        log = CollectiveLog()
        sharded(layout, P, top_k, top_p, log=log)
        assert len(log.entries) == count and log.max_elements() == largest < widest / 2
        assert log.bytes_sent() < n * vocab * 8 / 2  # under half the rows' own int64 bytes


def test_a_top_k_above_the_limit_is_refused_by_every_rank():
    vocab = sp.MAX_SHARD_TOP_K + 10
    P = torch.ones(1, vocab, dtype=torch.int64)
    layout = ShardLayout.cuts(vocab, [7])
    with pytest.raises(LocalProtocolError) as e:
        sharded(layout, P, sp.MAX_SHARD_TOP_K + 1, None)
    assert e.value.reason is Reason.UNSUPPORTED_FEATURE
    assert torch.equal(sharded(layout, P, vocab, None), P)  # k >= vocab: every id
    assert int((sharded(layout, P, sp.MAX_SHARD_TOP_K, None) > 0).sum()) == sp.MAX_SHARD_TOP_K
