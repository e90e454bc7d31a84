"""Exit adapters: the file (bounds, format, fit checks), the fit, and the drafter with one.

The file and fit tests need only torch and safetensors; the ones marked ``model`` load
the embedded SmolLM2-135M (conftest.smol).
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("safetensors", reason="exit adapters need: pip install 'pp1q[hf]'")

from pp1q.core.errors import ConfigError  # noqa: E402
from pp1q.models.exit_adapter import (  # noqa: E402
    ADAPTER_ID_HEX,
    MAX_ADAPTER_BYTES,
    ExitAdapter,
    check_fits,
    load_adapter,
    shipped_adapter,
)
from pp1q.tools.train_adapter import acceptance, fit_affine  # noqa: E402

H = 8


def _adapter(k=3, source="hf:x:sha256=00", seed=0) -> ExitAdapter:
    g = torch.Generator().manual_seed(seed)
    return ExitAdapter(torch.randn(H, H, generator=g), torch.randn(H, generator=g), source, k,
                       layers=6, training={"seed": seed})


def test_file_round_trip_names_its_content(tmp_path):
    saved = _adapter().save(tmp_path / "a.safetensors")
    assert len(saved.digest) == 64 and saved.tag == f"adapter={saved.digest[:ADAPTER_ID_HEX]}"
    again = _adapter().save(tmp_path / "again.safetensors")  # the same map written again
    assert again.digest == saved.digest
    assert _adapter(k=4).save(tmp_path / "k4.safetensors").digest != saved.digest
    back = load_adapter(tmp_path / "a.safetensors")
    assert torch.equal(back.weight, _adapter().weight) and torch.equal(back.bias, _adapter().bias)
    assert (back.source, back.k, back.layers, back.training) == ("hf:x:sha256=00", 3, 6,
                                                                  {"seed": 0})
    other = _adapter(seed=1).save(tmp_path / "b.safetensors")
    assert other.tag != saved.tag  # another map, another identity at HELLO


def test_saving_over_a_fifo_or_a_folder_is_refused_by_name(tmp_path):
    """safetensors 0.4.5's save_file blocked for ever opening a FIFO with no reader;
    0.8.0 replaces it by rename. Either way the path is refused by what it is."""
    from bounded_call import returns

    from pp1q.runtime.files import NotRegularFileError

    os.mkfifo(tmp_path / "fifo.safetensors")
    (tmp_path / "folder.safetensors").mkdir()
    for name, kind in (("fifo", "a FIFO"), ("folder", "a folder")):
        e = returns(_adapter().save, tmp_path / f"{name}.safetensors")
        assert isinstance(e, NotRegularFileError)
        assert e.strerror == f"is {kind}, not a regular file"


def _refused(path, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        load_adapter(path)
    assert info.value.key == "draft_adapter"


def test_bad_files_are_refused_with_the_setting_named(tmp_path):
    from safetensors.torch import save_file

    _refused(tmp_path / "absent.safetensors", "no such file")
    big = tmp_path / "big.safetensors"
    with open(big, "wb") as f:  # sparse: refused on its size, never read
        f.truncate(MAX_ADAPTER_BYTES + 1)
    _refused(big, "more than")
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    _refused(tmp_path / "junk.safetensors", "not a safetensors file")
    w, b = torch.eye(H), torch.zeros(H)
    save_file({"weight": w, "bias": b}, str(tmp_path / "nometa.safetensors"))
    _refused(tmp_path / "nometa.safetensors", "not a pp1q-exit-adapter")
    meta = {"format": "pp1q-exit-adapter/1", "source": "s", "k": "3", "layers": "6"}
    save_file({"weight": w[:, :4].contiguous(), "bias": b}, str(tmp_path / "shape.safetensors"),
              metadata=meta)
    _refused(tmp_path / "shape.safetensors", r"\[H, H\]")
    save_file({"weight": w.double(), "bias": b.double()}, str(tmp_path / "f64.safetensors"),
              metadata=meta)
    _refused(tmp_path / "f64.safetensors", "float32")
    nan = w.clone()
    nan[1, 2] = float("nan")
    save_file({"weight": nan, "bias": b}, str(tmp_path / "nan.safetensors"), metadata=meta)
    _refused(tmp_path / "nan.safetensors", "non-finite")
    save_file({"weight": w, "bias": b}, str(tmp_path / "k.safetensors"),
              metadata={**meta, "k": "three"})
    _refused(tmp_path / "k.safetensors", "bad metadata")


def test_a_map_fitted_for_another_checkpoint_exit_or_width_is_refused():
    adapter = _adapter(k=3, source="hf:a")
    check_fits(adapter, "hf:a", 3, H)
    for identity, k, hidden, words in (("hf:b", 3, H, "fitted on"), ("hf:a", 4, H, "early-exit:3"),
                                       ("hf:a", 3, H * 2, "hidden size")):
        with pytest.raises(ConfigError, match=words):
            check_fits(adapter, identity, k, hidden)


def test_ridge_fit_recovers_a_known_affine_map():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4000, H, generator=g)
    w, b = torch.randn(H, H, generator=g), torch.randn(H, generator=g)
    fw, fb = fit_affine(x, x @ w.T + b, ridge=1e-6)
    assert (fw - w).abs().max() < 1e-4 and (fb - b).abs().max() < 1e-4
    fw, _ = fit_affine(x, x @ w.T + b, ridge=1e4)  # the ridge really shrinks W
    assert fw.abs().sum() < 0.5 * w.abs().sum()


def test_acceptance_is_one_for_equal_states_and_lower_otherwise():
    g = torch.Generator().manual_seed(3)
    lm = torch.nn.Linear(H, 50, bias=False)

    def head(h):
        return lm(h)

    h = torch.randn(64, H, generator=g)
    assert acceptance(head, h, h, 1.0) == pytest.approx(1.0, abs=1e-6)
    assert acceptance(head, h + torch.randn(64, H, generator=g), h, 1.0) < 0.99


# -- with the real model --------------------------------------------------------------


@pytest.mark.model
def test_identity_map_leaves_the_exit_unchanged_and_a_real_map_changes_it(smol, story_ids):
    from real_model import full_logits, max_diff

    from pp1q.models.hf_drafter import HFDrafter, early_exit_view, hidden_size

    h = hidden_size(smol.model)
    same = ExitAdapter(torch.eye(h), torch.zeros(h), smol.identity, 8, 30, digest="ab" * 32)
    plain = full_logits(early_exit_view(smol.model, 8), story_ids)
    assert max_diff(full_logits(early_exit_view(smol.model, 8, same), story_ids), plain) == 0.0
    # a shift (a pure scaling would vanish in the RMS norm that follows the map)
    shift = torch.randn(h, generator=torch.Generator().manual_seed(0))
    moved = ExitAdapter(torch.eye(h), shift, smol.identity, 8, 30, digest="cd" * 32)
    assert max_diff(full_logits(early_exit_view(smol.model, 8, moved), story_ids), plain) > 0.1
    drafter = HFDrafter.early_exit(smol, 8, moved)
    assert drafter.identity.endswith(":early-exit=8/30:adapter=" + "cd" * 6)
    with pytest.raises(ConfigError, match="early-exit:8"):
        HFDrafter.early_exit(smol, 9, moved)


@pytest.mark.model
def test_shipped_map_raises_acceptance_on_text_it_never_saw(smol, story_ids):
    """Teacher-forced on the story (human text, not the model's own: no training prompt),
    the shipped k = 28 map must beat the plain exit's sum min(p, q) at T = 1. Measured
    when it was fitted: 0.58 -> 0.75 over these 19 positions (pp1q train-adapter reports its
    own held-out figures); a map that did nothing, or made things worse, fails."""
    from pp1q.models.hf_drafter import early_exit_view
    from pp1q.models.serving import exit_adapter

    adapter = exit_adapter("auto", smol.identity, 28)
    assert adapter is not None and shipped_adapter(smol.identity, 28) is not None
    assert exit_adapter("none", smol.identity, 28) is None
    assert exit_adapter("auto", smol.identity, 27) is None  # none shipped for k = 27
    ids = torch.tensor([story_ids])
    with torch.inference_mode():
        p = torch.softmax(smol.model(input_ids=ids).logits[0].float(), -1)
        plain = torch.softmax(early_exit_view(smol.model, 28)(input_ids=ids).logits[0].float(), -1)
        fitted = torch.softmax(
            early_exit_view(smol.model, 28, adapter)(input_ids=ids).logits[0].float(), -1)
    before = float(torch.minimum(p, plain).sum(-1).mean())
    after = float(torch.minimum(p, fitted).sum(-1).mean())
    assert after > before + 0.05, (before, after)


@pytest.mark.model
def test_train_writes_a_map_fitted_for_its_checkpoint_and_exit(smol, tmp_path):
    from pp1q.tools.train_adapter import Recipe, train

    lines = []
    recipe = Recipe(prompts=2, held_out=1, tokens=4, refine_steps=1)
    [fitted] = train(smol, [4], tmp_path, recipe, say=lines.append)
    adapter = load_adapter(fitted.path)
    check_fits(adapter, smol.identity, 4, adapter.hidden)
    assert adapter.training["prompts"] == 2 and adapter.training["refine_steps"] == 1
    assert set(fitted.plain) == set(fitted.adapted) == {0.7, 1.0}
    assert any("held-out acceptance" in line for line in lines)  # progress was reported
    with pytest.raises(ValueError, match="last layer"):
        train(smol, [30], tmp_path, Recipe(prompts=1, tokens=2, refine_steps=0))


@pytest.mark.model
def test_train_refuses_an_output_in_the_way_before_it_trains(smol, tmp_path):
    """A FIFO (or a folder) where an adapter file goes is refused at once, not after the
    minutes of generating and fitting (it was found only at the save)."""
    from pp1q.runtime.files import NotRegularFileError
    from pp1q.tools.train_adapter import Recipe, adapter_name, train

    os.mkfifo(tmp_path / adapter_name(smol, 4))
    lines = []
    with pytest.raises(NotRegularFileError):
        train(smol, [2, 4], tmp_path, Recipe(prompts=1, tokens=2, refine_steps=0),
              say=lines.append)
    assert lines == []  # nothing generated


def test_the_longest_drafter_identity_fits_hello():
    from pathlib import Path
    from types import SimpleNamespace

    from pp1q.models.hf import _identity
    from pp1q.models.hf_drafter import exit_identity
    from pp1q.wire.limits import MAX_ID_CHARS

    class Shape:  # a 999-layer model of width H, as far as the identity looks
        def get_decoder(self):
            return SimpleNamespace(layers=[None] * 999, norm=None)

        def get_output_embeddings(self):
            return SimpleNamespace(weight=torch.empty(2, H))

    checkpoint = _identity(Path("x" * 200 + ".gguf"), "f" * 64)  # stem cut to its limit
    adapter = ExitAdapter(torch.eye(H), torch.zeros(H), checkpoint, 998, 999, digest="e" * 64)
    ckpt = SimpleNamespace(identity=checkpoint, model=Shape())
    assert len(exit_identity(ckpt, 998, adapter)) <= MAX_ID_CHARS


@pytest.mark.model
@pytest.mark.parametrize("setting,adapted", [("auto", True), ("none", False)])
def test_hello_says_a_drafter_with_an_exit_adapter_is_adapted(smol, gguf_cache, setting,
                                                              adapted):
    # the design's HELLO "native-or-adapted identity": the verifier's expectation of the
    # drafter (and the worker's own, built by the same serving code) names it
    from pp1q.models.serving import load_target
    from pp1q.runtime.settings import VerifierSettings
    from pp1q.wire.session_config import engine_identity

    loaded = load_target(VerifierSettings(model="embedded", gguf_cache=str(gguf_cache),
                                          draft="early-exit:28", draft_adapter=setting))
    assert loaded.draft_adapted is adapted
    assert (":adapter=" in loaded.draft_id) is adapted  # the shipped map for exit 28
    ident = engine_identity(loaded.vocab, loaded.tokenizer_digest, loaded.draft_id,
                            loaded.target_id, loaded.draft_adapted)
    assert ident.draft_adapted is adapted
