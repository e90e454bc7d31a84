import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_clean():
    if shutil.which("ruff") is None:
        pytest.fail("ruff is a test dependency: install with scripts/install.sh test")
    out = subprocess.run(["ruff", "check", str(ROOT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_pickle_anywhere():
    offenders = [p for top in ("pp1q", "pp1q_kernels") for p in (ROOT / top).rglob("*.py")
                 if "import pickle" in p.read_text()]
    assert offenders == []


def test_kernels_ship_as_pp1q_kernels_not_kernels():
    """Nothing in the repository answers to the name ``kernels``, from its root (the
    current directory comes first on sys.path there): transformers imports PyPI's
    ``kernels`` package, and a folder of ours by that name shadowed it."""
    import pp1q_kernels

    assert Path(pp1q_kernels.__file__).resolve().parent == ROOT / "pp1q_kernels"
    probe = "import importlib.util as u; s = u.find_spec('kernels'); print(s and s.origin)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=ROOT)
    found = out.stdout.strip()  # "None", or where PyPI's kernels is installed
    # (transformers 5.25 requires it: a venv made inside the clone holds it there)
    installed = Path(sys.prefix).resolve()
    assert found == "None" or not Path(found).resolve().is_relative_to(ROOT) or \
        Path(found).resolve().is_relative_to(installed), found
