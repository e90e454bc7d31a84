"""docs/anchors.md names, for each peer bug in ANCHORS.md, the tests that catch it."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _named_tests():
    text = (ROOT / "docs" / "anchors.md").read_text()
    return re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)


def test_every_named_test_exists():
    named = _named_tests()
    assert len(named) >= 8
    missing = []
    for path, name in named:
        tree = ast.parse((ROOT / path).read_text())
        funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
        defined = {n.name for n in ast.walk(tree) if isinstance(n, funcs)}
        if name not in defined:
            missing.append(f"{path}::{name}")
    assert missing == []


def test_every_anchor_bug_row_has_a_test():
    rows = [line for line in (ROOT / "docs" / "anchors.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| peer bug")]
    assert len(rows) == 8
    assert all("tests/" in row for row in rows)
