"""GrowingLayer (pp1q.models.hf_cache): K/V appended in place, read as DynamicLayer's.

Two checks of one claim. On random tensors, a GrowingLayer and transformers' own
DynamicLayer given the same appends and crops show the same keys and values, and an
append that fits writes into the buffer it had (no copy). Through the engine seam
(HFTarget, whose ``lm.new_cache`` makes growing caches), a prompt prefilled in chunks
scores the rows a whole prefill gives. Each check is also run on a planted bug entering
through the same seam (a grow that forgets the held positions, an append written over
the chunk before it): the comparison must reject it, or it proves nothing.
"""

from __future__ import annotations

import pytest
import torch
from real_model import full_logits, max_diff

pytest.importorskip("transformers", reason="real-model tests need: pip install 'pp1q[hf]'")

from transformers.cache_utils import DynamicLayer  # noqa: E402

from pp1q.models import hf_cache  # noqa: E402
from pp1q.models.hf_cache import cache_bytes  # noqa: E402
from pp1q.models.hf_target import HFTarget  # noqa: E402

TOL = 1e-4  # float64, as tests/models/test_hf_target.py


def _forgets_on_grow():
    """A planted bug: a grow that does not copy the positions held (zeros instead)."""
    base = hf_cache.growing_layer()

    class Forgets(base):
        def _grow(self, key_states, value_states, held, need):
            super()._grow(key_states, value_states, 0, need)
            self._k.zero_()
            self._v.zero_()

    return Forgets


def _drops_a_chunk():
    """A planted bug: the second append's K/V never written (zeros where that chunk's
    positions are shown; the length right, the content lost)."""
    base = hf_cache.growing_layer()

    class Drops(base):
        def update(self, key_states, value_states, *args, **kwargs):
            self._appends = getattr(self, "_appends", 0) + 1
            if self._appends == 2:
                key_states, value_states = key_states * 0, value_states * 0
            return super().update(key_states, value_states, *args, **kwargs)

    return Drops


PLANTED = {"forgets-on-grow": _forgets_on_grow, "drops-a-chunk": _drops_a_chunk}


def _same_as_dynamic(layer_cls, steps) -> bool:
    """Whether ``layer_cls`` shows DynamicLayer's keys and values after each of ``steps``
    (an int n > 0: append n positions; n < 0: crop -n), on random float64 states."""
    g = torch.Generator().manual_seed(3)
    ours, theirs = layer_cls(), DynamicLayer()
    for n in steps:
        if n > 0:
            k, v = (torch.randn(1, 3, n, 8, generator=g, dtype=torch.float64) for _ in "kv")
            got, want = ours.update(k, v), theirs.update(k, v)
        else:
            ours.crop(n)
            theirs.crop(n)
            got, want = (ours.keys, ours.values), (theirs.keys, theirs.values)
        if any(a.shape != b.shape or not torch.equal(a, b) for a, b in zip(got, want,
                                                                            strict=True)):
            return False
    return True


STEPS = [5, 1, 1, 30, -3, 2, 40, -40, 7, 1, 100, -1, 1]


def test_a_growing_layer_shows_what_a_dynamic_layer_shows():
    assert _same_as_dynamic(hf_cache.growing_layer(), STEPS)


@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_the_layer_comparison_rejects_a_planted_bug(planted):
    assert not _same_as_dynamic(PLANTED[planted](), STEPS)


def test_an_append_that_fits_writes_in_place_and_a_grow_keeps_room():
    layer = hf_cache.growing_layer()()
    k = torch.zeros(1, 3, 40, 8)
    layer.update(k, k)
    room, where = layer.room, layer.keys.data_ptr()
    assert room >= 40 + hf_cache.MIN_SPARE
    layer.update(k[:, :, :2], k[:, :, :2])  # fits: the same buffer
    assert layer.keys.data_ptr() == where and layer.room == room
    layer.crop(-10)
    layer.update(k[:, :, :room - 32], k[:, :, :room - 32])  # exactly full
    assert layer.keys.data_ptr() == where and layer.get_seq_length() == room
    layer.update(k[:, :, :1], k[:, :, :1])  # one more: a new buffer, GROWTH x
    assert layer.room == int((room + 1) * hf_cache.GROWTH)
    assert layer.held_bytes() == 2 * layer.room * 3 * 8 * 4


def test_a_reordered_layer_is_copied_not_overwritten():
    # a layer whose views were replaced (beam search's reorder) no longer shows its
    # buffer: the next append copies what it shows into a new one
    layer = hf_cache.growing_layer()()
    a, b = torch.ones(2, 3, 4, 8), torch.full((2, 3, 1, 8), 5.0)
    a[1] = 2.0
    layer.update(a, a)
    layer.reorder_cache(torch.tensor([1, 0]))
    keys, _ = layer.update(b, b)
    assert torch.equal(keys[0, :, :4], a[1]) and torch.equal(keys[1, :, :4], a[0])


# -- through the engine seam (the real model) ---------------------------------------


def _prompt(vocab: int, n: int = 300) -> list[int]:
    g = torch.Generator().manual_seed(5)
    return [int(x) for x in torch.randint(10, vocab, (n,), generator=g)]


def _chunked_rows(target: HFTarget, prompt: list[int], chunk: int, drafts: list[int]):
    target.open("r", prompt[:chunk])
    for i in range(chunk, len(prompt), chunk):
        target.extend("r", prompt[i:i + chunk])
    rows = target.score([("r", drafts)])[0]
    target.close("r")
    return rows


DRAFTS = [1030, 314, 253]


@pytest.fixture(scope="module")
def whole(smol64):
    """The prompt and the rows a whole prefill gives (one float64 forward per module)."""
    prompt = _prompt(smol64.vocab)
    return prompt, full_logits(smol64.model, prompt + DRAFTS)[len(prompt) - 1:]


@pytest.mark.model
@pytest.mark.parametrize("chunk", [40, 128])
def test_chunks_on_growing_caches_score_a_whole_prefills_rows(smol64, whole, chunk):
    prompt, want = whole
    target = HFTarget.from_checkpoint(smol64)
    assert all(isinstance(layer, hf_cache.growing_layer())
               for layer in target.lm.new_cache().layers)
    assert max_diff(_chunked_rows(target, prompt, chunk, DRAFTS), want) <= TOL


@pytest.mark.model
@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_the_chunked_comparison_rejects_a_planted_cache(smol64, whole, monkeypatch, planted):
    prompt, want = whole
    monkeypatch.setattr(hf_cache, "_GROWING", PLANTED[planted]())  # what new_cache makes
    rows = _chunked_rows(HFTarget.from_checkpoint(smol64), prompt, 40, DRAFTS)
    assert max_diff(rows, want) > 100 * TOL


@pytest.mark.model
def test_float32_growing_cache_gives_dynamic_caches_logits(smol, monkeypatch):
    # the production dtype: the same chunks on transformers' own DynamicCache (no
    # growing layers) give the same rows (measured: equal; bound 1e-5)
    prompt = _prompt(smol.vocab)
    grown = _chunked_rows(HFTarget.from_checkpoint(smol), prompt, 128, DRAFTS)
    monkeypatch.setattr("pp1q.models.hf.make_growing", lambda cache: cache)  # new_cache's
    target = HFTarget.from_checkpoint(smol)
    assert type(target.lm.new_cache().layers[0]) is DynamicLayer
    plain = _chunked_rows(target, prompt, 128, DRAFTS)
    assert max_diff(grown, plain) <= 1e-5


@pytest.mark.model
def test_kv_bytes_count_the_buffers_room(smol64):
    target = HFTarget.from_checkpoint(smol64)
    target.open("r", _prompt(smol64.vocab, 41))
    cache = target._requests["r"][1]
    cfg = smol64.model.config
    per_position = 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 8
    layers = cfg.num_hidden_layers
    held = cache_bytes(cache)
    assert held == layers * per_position * max(int(40 * hf_cache.GROWTH), 40 + hf_cache.MIN_SPARE)
    assert target.kv_bytes("r") == held
