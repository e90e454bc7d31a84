"""The README's Python blocks run as written, and every relative link of the README and
docs/ resolves inside the repository (a clone has nothing outside it)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pp1q.runtime.launcher import daemon_env

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
RUN_TIMEOUT_S = 120.0  # imports torch once; the blocks themselves take milliseconds


def blocks() -> list[str]:
    return BLOCK.findall(README.read_text())


def test_the_readme_has_its_library_examples():
    assert len(blocks()) >= 3  # pp1q.q, pp1q.verify/reference, pp1q_kernels


@pytest.mark.parametrize("i", range(len(blocks())))
def test_readme_python_block_runs_as_written(i):
    # a fresh interpreter: a block may rely only on what it imports itself
    proc = subprocess.run([sys.executable, "-c", blocks()[i]], capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, env=daemon_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_every_relative_link_resolves_inside_the_repository():
    bad = []
    for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            path = (doc.parent / target).resolve()
            if not path.exists() or ROOT not in path.parents:
                bad.append(f"{doc.name}: {target}")
    assert not bad
