"""Exact integer helpers (kernels/fixed.py) against Python's unbounded integers."""

import math
from fractions import Fraction

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pp1q_kernels import fixed

BELOW_62 = st.integers(0, (1 << 62) - 1)
U53 = st.integers(0, (1 << 53) - 1)
COUNT = st.integers(1, 1 << 24)
T = torch.tensor


@settings(max_examples=300, deadline=None)
@given(BELOW_62, BELOW_62, st.integers(1, 62))
def test_wide_product_and_shift(a, b, s):
    hi, lo = fixed.mul_wide(T(a), T(b))
    assert int(hi) * 2**62 + int(lo) == a * b and 0 <= int(lo) < 2**62
    if (a * b) >> s < 2**63:
        assert int(fixed.floor_mul_shift(T(a), T(b), s)) == (a * b) >> s


@settings(max_examples=300, deadline=None)
@given(U53, st.integers(1, (1 << 62) - 1))
def test_draw_threshold_is_exact_and_below_total(u, w):
    thr = int(fixed.draw_threshold(T(u), T(w)))
    assert thr == (u * w) >> 53 and thr < w


@settings(max_examples=300, deadline=None)
@given(COUNT, st.integers(1, (1 << 62) - 1))
def test_q_units_is_exact_floor(c, s_total):
    assert int(fixed.q_units(T(c), T(s_total))) == (c * s_total) >> 24


@settings(max_examples=500, deadline=None)
@given(U53, COUNT, st.integers(1, (1 << 62) - 1), st.integers(0, 1 << 61),
       st.sampled_from([None, -1, 0, 1]))
def test_ratio_test_is_exact_including_boundaries(u, c, s_total, p_x, near):
    if near is not None:  # put P_x on or next to the exact boundary u c S / 2^77
        p_x = max(0, min(1 << 61, (u * c * s_total >> 77) + near))
    want = Fraction(u, 2**53) < Fraction(p_x, s_total) / Fraction(c, 2**24)
    assert bool(fixed.accepts_exact(T(u), T(c), T(p_x), T(s_total))) == want


def test_ratio_test_strict_at_zero_draw_and_zero_p():
    one = T(1)
    assert not bool(fixed.accepts_exact(T(0), one, T(0), T(1 << 61)))  # p = 0, u = 0
    assert bool(fixed.accepts_exact(T(0), one, one, T(1 << 61)))


def test_to_fixed_is_exact_for_float32_entries_down_to_2_pow_minus_38():
    p = torch.tensor([1.0, 0.5, 2.0**-38, 3 * 2.0**-40, 2.0**-62, 0.0], dtype=torch.float32)
    got = fixed.to_fixed(p).tolist()
    assert got == [2**61, 2**60, 2**23, 3 * 2**21, 0, 0]
    assert fixed.to_fixed(p.to(torch.bfloat16)).tolist()[:3] == [2**61, 2**60, 2**23]


def test_exact_sum_is_independent_of_order_and_split():
    g = np.random.default_rng(5)
    x = torch.tensor(np.exp(g.normal(0, 4, 5000) - 12).clip(0, 1))
    ref = fixed.exact_sum(x)
    assert abs(float(ref) - math.fsum(x.tolist())) <= math.ulp(float(ref))
    for _ in range(5):
        perm = x[torch.from_numpy(g.permutation(x.numel()))]
        assert torch.equal(fixed.exact_sum(perm), ref)
        cuts = sorted(g.choice(np.arange(1, x.numel()), 3, replace=False).tolist())
        parts = [fixed.sum_limbs(piece) for piece in torch.tensor_split(perm, cuts)]
        hi = sum(p[0] for p in parts)
        lo = sum(p[1] for p in parts)
        assert torch.equal(fixed.limbs_to_float(hi, lo), ref)


def test_exact_sum_rounds_like_fsum_on_many_rows():
    g = np.random.default_rng(6)
    rows = torch.tensor(np.exp(g.normal(0, 3, (200, 3000)) - 9).clip(0, 1))
    got = fixed.exact_sum(rows).tolist()
    assert sum(a != math.fsum(r) for a, r in zip(got, rows.tolist(), strict=True)) <= 2
