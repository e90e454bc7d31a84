"""Every Triton kernel the service launches compiles for a GPU (CUDA, sm_90), checked on a
machine with none. The interpreter tests (test_kernels_triton.py) run the kernels as
plain Python, which accepts what Triton's compiler refuses: a list comprehension in the
Philox kernel passed them all and would have failed its first compile on a GPU. The
compile runs in its own process (tests/support/compile_triton.py), without
TRITON_INTERPRET, under which ``@triton.jit`` makes interpreted functions."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = re.compile(r"^\s*(_\w+)\[\(", re.M)  # a launch: name[(grid)](args)

TRITON = importlib.util.find_spec("triton")  # found, not imported: the interpreter
# tests need TRITON_INTERPRET set before triton's first import in this process
pytestmark = pytest.mark.skipif(
    TRITON is None or not (Path(TRITON.origin).parent / "backends/nvidia").is_dir(),
    reason="no Triton with its CUDA backend here")


def launched() -> set[str]:
    """The kernels kernels/triton_*.py launch, read from their source."""
    return {name for path in (ROOT / "pp1q_kernels").glob("triton_*.py")
            for name in LAUNCH.findall(path.read_text())}


def test_every_launched_kernel_compiles_for_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(ROOT / "tests/support/compile_triton.py")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert launched() == {"_philox_words_kernel", "_allocate", "_tile_sums", "_pick",
                          "_decide"}  # a new kernel joins compile_triton.py's list
    assert set(out.stdout.split()) == launched()
