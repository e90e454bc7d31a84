import numpy as np
import pytest

from pp1q.models.toy import DRAFT_PRESETS, ToyDrafter, ToySpec, ToyTarget, softmax64, toy_pair


def test_same_spec_same_logits_and_different_seed_differs():
    a = ToyTarget(ToySpec(vocab=64, seed=3)).logits([1, 2, 3], [4, 5])
    b = ToyTarget(ToySpec(vocab=64, seed=3)).logits([1, 2, 3], [4, 5])
    c = ToyTarget(ToySpec(vocab=64, seed=4)).logits([1, 2, 3], [4, 5])
    assert a.shape == (3, 64) and a.dtype == np.float64
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)


def test_target_rows_are_conditioned_on_the_draft_prefix():
    t = ToyTarget(ToySpec(vocab=32, seed=1))
    full = t.logits([7, 8], [9, 10, 11])
    for i in range(4):
        # row i of one call equals the single row for prefix + draft[:i]
        alone = t.logits([7, 8] + [9, 10, 11][:i], [])
        assert np.allclose(full[i], alone[0], atol=1e-4)  # FP32 products: blocking differs


def test_matched_drafter_equals_target_on_the_first_two_positions_only():
    spec = ToySpec(vocab=128, seed=2)
    d, t = ToyDrafter.preset(spec, "matched"), ToyTarget(spec)
    prefix, xs = [5, 6, 7], [11, 12, 13, 14]
    bb = d.backbone(prefix, 5)
    prev = [prefix[-1]] + xs
    rows = np.stack([d.row_logits(bb[i], prev[i]) for i in range(5)])
    p = t.logits(prefix, xs)
    assert np.allclose(rows[:2], p[:2], atol=1e-4)
    assert not np.allclose(rows[2], p[2], atol=1e-3)  # backbone cannot see x_1 at i = 3


def test_adversarial_negates_and_distance_moves_away():
    spec = ToySpec(vocab=64, seed=0)
    bb_m = ToyDrafter.preset(spec, "matched").backbone([1, 2], 3)
    bb_a = ToyDrafter.preset(spec, "adversarial").backbone([1, 2], 3)
    assert np.allclose(bb_a, -bb_m)
    t = ToyTarget(spec)
    p = softmax64(t.logits([1, 2], []))[0]

    def overlap(preset):
        d = ToyDrafter.preset(spec, preset)
        q = softmax64(d.row_logits(d.backbone([1, 2], 1)[0], 2))
        return np.minimum(p, q).sum()

    assert overlap("matched") > overlap("far") > overlap("adversarial")


def test_identities_name_vocab_seed_and_pairing():
    d, t = toy_pair(vocab=100, seed=9, preset="close")
    assert "vocab=100" in t.identity and "seed=9" in t.identity
    assert d.target_identity == t.identity
    d2, t2 = toy_pair(vocab=100, seed=10)
    assert d2.target_identity != t.identity


@pytest.mark.parametrize("bad", [dict(vocab=1), dict(vocab=1 << 21), dict(seed=-1)])
def test_spec_bounds(bad):
    with pytest.raises(ValueError):
        ToySpec(**bad)


def test_unknown_preset_and_bad_distance_refused():
    with pytest.raises(ValueError):
        toy_pair(vocab=16, preset="nope")
    with pytest.raises(ValueError):
        ToyDrafter(ToySpec(vocab=16), distance=1.5)
    assert set(DRAFT_PRESETS) >= {"matched", "close", "far", "adversarial"}


def test_empty_prefix_is_allowed():
    d, t = toy_pair(vocab=16, seed=0)
    assert t.logits([], [3]).shape == (2, 16)
    assert d.backbone([], 5).shape == (5, 16)
    assert np.isfinite(d.markov_bias(None)).all()
