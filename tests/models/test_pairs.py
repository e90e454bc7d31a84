"""Drafter/target pairing: tokenizer digests must match, refused with a reason if not."""

from __future__ import annotations

import pytest

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.models.engine import check_pair
from pp1q.models.toy import ToyDrafter, ToySpec, ToyTarget
from pp1q.models.toy_engine import ToyDrafterEngine, ToyTargetEngine


def _toy(vocab):
    spec = ToySpec(vocab=vocab, seed=0)
    return ToyDrafterEngine(ToyDrafter(spec)), ToyTargetEngine(ToyTarget(spec))


def test_toy_pair_matches_and_vocab_mismatch_refused():
    d, t = _toy(64)
    check_pair(d, t)
    _, other = _toy(65)
    with pytest.raises(LocalProtocolError) as err:
        check_pair(d, other)
    assert err.value.reason is Reason.TOKENIZER_MISMATCH


@pytest.mark.model
def test_hf_pair_checks(smol, tmp_path):
    from real_model import full_logits, max_diff

    from pp1q.models.hf import export_folder, gguf_cache_entry, load_checkpoint
    from pp1q.models.hf_drafter import HFDrafter
    from pp1q.models.hf_target import HFTarget

    target = HFTarget.from_checkpoint(smol)
    # a second checkpoint sharing the tokenizer: the GGUF exported as a safetensors folder,
    # written where load_checkpoint(gguf, gguf_cache=...) looks for its de-quantized copy
    folder = export_folder(smol, gguf_cache_entry(smol.path, tmp_path / "cache"))
    second = load_checkpoint(folder)
    assert second.identity != smol.identity
    assert second.tokenizer_digest == smol.tokenizer_digest
    assert max_diff(full_logits(second.model, [1, 2, 3]), full_logits(smol.model, [1, 2, 3])) == 0
    check_pair(HFDrafter.from_checkpoint(second), target)
    # through the cache: read from the folder, named as the GGUF (hosts agree at HELLO)
    cached = load_checkpoint(smol.path, gguf_cache=tmp_path / "cache")
    assert cached.identity == smol.identity and cached.load_seconds < 10
    assert cached.tokenizer_digest == smol.tokenizer_digest
    # same width, different id map: refused
    toy_drafter, _ = _toy(smol.vocab)
    with pytest.raises(LocalProtocolError) as err:
        check_pair(toy_drafter, target)
    assert err.value.reason is Reason.TOKENIZER_MISMATCH


@pytest.mark.model
@pytest.mark.slow
def test_gguf_cache_miss_writes_the_entry(smol, tmp_path):
    from pp1q.models.hf import EXPORT_MARKER, gguf_cache_entry, load_checkpoint

    first = load_checkpoint(smol.path, gguf_cache=tmp_path)  # parses the GGUF, writes
    assert (gguf_cache_entry(smol.path, tmp_path) / EXPORT_MARKER).is_file()
    again = load_checkpoint(smol.path, gguf_cache=tmp_path)
    assert first.identity == again.identity == smol.identity
    assert again.load_seconds < first.load_seconds
