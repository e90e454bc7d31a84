"""wire/table.py is the only place where a connection or slot state changes (h11's rule).

Every other module of pp1q/wire is read as source: no assignment to a ``state``
attribute (plain, augmented, annotated, tuple-unpacked, or via setattr) outside the
constructors that set the initial IDLE state.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pp1q.wire

WIRE = Path(pp1q.wire.__file__).parent


def _targets(node: ast.AST):
    if isinstance(node, ast.Assign):
        todo = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        todo = [node.target]
    else:
        return
    while todo:
        t = todo.pop()
        if isinstance(t, ast.Tuple | ast.List):
            todo.extend(t.elts)
        elif isinstance(t, ast.Starred):
            todo.append(t.value)
        else:
            yield t


def _state_writes(tree: ast.AST) -> list[int]:
    """Line numbers of every write to ``<something>.state`` outside ``__init__``'s
    initial ``... = Conn.IDLE``."""
    lines = []
    for fn in [tree, *[n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]]:
        body = fn.body if isinstance(fn, ast.FunctionDef) else [
            n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.ClassDef)]
        for stmt in body:
            for node in ast.walk(stmt):
                for t in _targets(node):
                    if isinstance(t, ast.Attribute) and t.attr == "state":
                        initial = (getattr(fn, "name", "") == "__init__"
                                   and ast.unparse(node.value) == "Conn.IDLE")
                        if not initial:
                            lines.append(node.lineno)
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id == "setattr" and len(node.args) > 1
                        and isinstance(node.args[1], ast.Constant)
                        and node.args[1].value == "state"):
                    lines.append(node.lineno)
    return sorted(set(lines))


def test_no_module_but_the_table_changes_a_state():
    offenders = {}
    for path in sorted(WIRE.rglob("*.py")):
        if path.name == "table.py":
            continue
        lines = _state_writes(ast.parse(path.read_text(), str(path)))
        if lines:
            offenders[path.name] = lines
    assert not offenders, f"state written outside wire/table.py: {offenders}"


def test_the_checker_sees_every_kind_of_write():
    src = '''
class E:
    def __init__(self):
        self.state = Conn.IDLE
    def f(self, s):
        s.state = 1
        self.state, x = 2, 3
        s.state += 1
        setattr(s, "state", 4)
'''
    assert _state_writes(ast.parse(src)) == [6, 7, 8, 9]
