import itertools

import numpy as np
import pytest

from pp1q.core.errors import LocalProtocolError
from pp1q.core.rng import (
    Domain,
    accepts,
    draw_words,
    pack_counter,
    pack_key,
    philox4x32_10,
    proposal_u24,
    u24_from_words,
    u53_from_words,
    uniform53,
)

# Random123 known answers (../shared/ANCHORS.md)
KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    (
        [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
        [0xA4093822, 0x299F31D0],
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
    ),
]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_philox_known_answers(ctr, key, expected):
    assert philox4x32_10(ctr, key).tolist() == expected


def test_philox_vectorised_matches_scalar():
    ctrs = np.array([k[0] for k in KAT], dtype=np.uint32)
    keys = np.array([k[1] for k in KAT], dtype=np.uint32)
    assert philox4x32_10(ctrs, keys).tolist() == [k[2] for k in KAT]


def test_packing_is_injective_over_every_field():
    fields = list(itertools.product([0, 1, (1 << 24) - 1], [0, 1, 2**32 - 1],
                                    [0, 7, 2**32 - 1], list(Domain), [0, 1, 2**32 - 1]))
    packed = {tuple(pack_counter(g, r, p, d, c).tolist()) for g, r, p, d, c in fields}
    assert len(packed) == len(fields)


def test_domains_never_share_noise():
    words = {d: tuple(draw_words(9, 3, 4, 100, d).tolist()) for d in Domain}
    assert len(set(words.values())) == len(Domain)


def test_key_packing_is_seed_low_high():
    assert pack_key((7 << 32) | 5).tolist() == [5, 7]
    assert pack_key(2**64 - 1).tolist() == [2**32 - 1, 2**32 - 1]


@pytest.mark.parametrize("bad", [dict(generation=1 << 24), dict(round_id=1 << 32),
                                 dict(position=-1), dict(counter=1 << 32)])
def test_out_of_range_fields_refused(bad):
    args = dict(generation=0, round_id=0, position=0, domain=Domain.ACCEPTANCE, counter=0)
    args.update(bad)
    with pytest.raises(LocalProtocolError):
        pack_counter(**args)


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, True])
def test_bad_seed_refused(seed):
    with pytest.raises(LocalProtocolError):
        pack_key(seed)


def test_draw_ranges_and_determinism():
    pos = np.arange(10_000)
    w = draw_words(123, 1, 2, pos, Domain.PROPOSAL)
    u24 = u24_from_words(w)
    u53 = u53_from_words(w)
    assert u24.min() >= 0 and u24.max() < 2**24
    assert u53.min() >= 0 and u53.max() < 2**53
    assert proposal_u24(123, 1, 2, 17) == int(u24[17])
    assert uniform53(123, 1, 2, 17, Domain.PROPOSAL) == int(u53[17])
    # roughly uniform: the mean of 10k u24 draws lies within 6 sigma of 2^23
    sigma = 2**24 / np.sqrt(12 * len(u24))
    assert abs(u24.mean() - 2**23) < 6 * sigma


def test_one_draw_equals_the_vectorised_words():
    """proposal_u24 and uniform53 compute one position's words with Python integers:
    the same as draw_words (held to Random123's answers above), over random and extreme
    fields in every domain."""
    g = np.random.default_rng(17)
    top = 2**32 - 1
    fields = [(0, 0, 0, 0), (2**64 - 1, 2**24 - 1, top, top), (2**63, 1, top, 0)]
    fields += [(int(g.integers(0, 2**63)) * 2 + int(g.integers(0, 2)),
                int(g.integers(0, 2**24)), int(g.integers(0, 2**32)),
                int(g.integers(0, 2**32))) for _ in range(200)]
    for seed, gen, rnd, pos in fields:
        for domain in Domain:
            w = draw_words(seed, gen, rnd, pos, domain)
            assert uniform53(seed, gen, rnd, pos, domain) == int(u53_from_words(w))
        w = draw_words(seed, gen, rnd, pos, Domain.PROPOSAL)
        assert proposal_u24(seed, gen, rnd, pos) == int(u24_from_words(w))


@pytest.mark.parametrize("bad", [dict(seed=True), dict(seed=-1), dict(seed=2**64),
                                 dict(generation=1 << 24), dict(round_id=1 << 32),
                                 dict(position=-1), dict(position=1 << 32),
                                 dict(position=1.0), dict(generation=False)])
def test_one_draw_refuses_what_draw_words_refuses(bad):
    args = dict(seed=1, generation=0, round_id=0, position=0)
    args.update(bad)
    for draw in (lambda: proposal_u24(**args), lambda: uniform53(**args, domain=Domain.BONUS),
                 lambda: draw_words(**args, domain=Domain.PROPOSAL)):
        with pytest.raises(LocalProtocolError):
            draw()


def test_accepts_is_exact_and_strict():
    from fractions import Fraction as F
    half = 1 << 52
    assert not accepts(0, F(0), F(1, 2))          # p = 0 never accepted, even with draw 0
    assert accepts(0, F(1, 2**60), F(1, 2))
    assert not accepts(half, F(1, 4), F(1, 2))    # U = 1/2 is not < 1/2
    assert accepts(half - 1, F(1, 4), F(1, 2))
    assert accepts(2**53 - 1, F(1, 2), F(1, 2))   # ratio 1 always accepts
