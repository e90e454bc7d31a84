"""Which test modules a ``-m`` expression leaves nothing to run in, decided from the
source without importing it (tests/conftest.py's ``pytest_ignore_collect``): collecting
a module imports it, and the inner loop's deselected modules import openai,
transformers and the daemon machinery for nothing."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

try:  # pytest's own -m parser (private): without it nothing is skipped, all is collected
    from _pytest.mark.expression import Expression
except ImportError:  # pragma: no cover - a pytest that moved it
    Expression = None

_OPERATORS = {"and", "or", "not", "True", "False"}


def module_marks(source: bytes | str) -> set[str] | None:
    """The marker names of a module's own ``pytestmark`` (None where it has none, or one
    not written as ``pytest.mark.NAME`` or a list of them: then nothing is assumed)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, ast.List) else [node.value]
            names = {v.attr for v in values if isinstance(v, ast.Attribute)
                     and ast.unparse(v.value) == "pytest.mark"}
            return names if len(names) == len(values) else None
    return None


def deselects_all(marks: set[str], markexpr: str) -> bool:
    """Whether ``markexpr`` is false for a test carrying ``marks`` whatever marks the test
    adds: only the names the expression reads can change its value, so every subset of
    them is tried (a handful: 2^3 for the inner loop's expression)."""
    if Expression is None:
        return False
    expr = Expression.compile(markexpr)
    others = sorted(set(re.findall(r"[\w.+-]+", markexpr)) - _OPERATORS - marks)
    for n in range(len(others) + 1):
        for extra in itertools.combinations(others, n):
            have = marks | set(extra)
            if expr.evaluate(lambda name, have=have: name in have):
                return False
    return True


def deselects_every_test(path: Path, markexpr: str) -> bool:
    try:
        marks = module_marks(path.read_bytes())
    except OSError:
        return False
    return bool(marks) and deselects_all(marks, markexpr)
