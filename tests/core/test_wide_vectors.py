"""numba's vector width (pp1q.core.backend_choice.prefer_wide_vectors): 512-bit registers
where the host has AVX-512, set before numba loads and never over the user's own choice.
Each case runs in a fresh interpreter: the setting only counts before numba's import.
That the kernels decide and check the same at either width is the kernel suites' job
(they run at whatever width this machine gets)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("numba")

PROBE = """
import os, sys
from pp1q.core.backend_choice import prefer_wide_vectors
{before}
prefer_wide_vectors()
print(os.environ.get("NUMBA_CPU_FEATURES", "<unset>"))
"""


def _run(before: str = "", **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    out = subprocess.run([sys.executable, "-c", PROBE.format(before=before)],
                         env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _host_has_avx512() -> bool:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    return "+avx512f" in llvm.get_host_cpu_features().flatten().split(",")


def test_wide_vectors_where_the_host_has_avx512_else_numbas_default():
    got = _run()
    if _host_has_avx512():
        assert got.endswith(",-prefer-256-bit") and "+avx512f" in got.split(",")
    else:
        assert got == "<unset>"


def test_the_users_own_setting_is_kept():
    assert _run(NUMBA_CPU_FEATURES="+sse2") == "+sse2"
    assert _run(NUMBA_CPU_NAME="generic") == "<unset>"


def test_nothing_changes_once_numba_is_imported():
    assert _run(before="import numba") == "<unset>"
