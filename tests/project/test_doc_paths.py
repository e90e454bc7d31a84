"""Every repository path (`pp1q/...`, `tests/...`, `deploy/...`) and every dotted module
name (`pp1q.x.y`, `pp1q_kernels.x`, with an attribute after it) the docs write exists,
read from the source files without importing them. tests/project/test_readme.py checks
the Markdown links; these are the names written as text (architecture.md's map, the
hops of a request, "go to" tables), which nothing checked."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "RELIABILITY.md",
        ROOT / "BENCHMARKS.md"]
PATH = re.compile(r"(?<![\w./-])((?:pp1q|pp1q_kernels|tests|scripts|deploy|fuzz)/[\w./@-]*\w)")
DOTTED = re.compile(r"(?<![\w./-])((?:pp1q|pp1q_kernels)(?:\.[A-Za-z_]\w*)+)")
# written as text but not files of the tree: made at run time, a glob's stem, a unit
# template's name without its suffix, the config file's name, a file:function
NOT_FILES = {"pp1q/core/__pycache__", "fuzz/corpus", "tests/verifier/test_daemon_",
             "deploy/systemd/pp1q-verifier"}
NOT_MODULES = {"pp1q.toml",
               "pp1q.draft_temperature"}  # a request field's path (the `pp1q` extension object)


# pp1q.q, pp1q.rng, ...: `sys.modules[__name__] = _module`, an alias of a core module
ALIAS = re.compile(r"^from (\S+) import (\w+) as _module$", re.M)


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            if m := ALIAS.search(f.read_text()):  # the module the alias stands for
                return _module_file([*m.group(1).split("."), m.group(2)])
            return f
    return None


def _defines(path: Path, name: str) -> bool:
    text = path.read_text()
    return bool(re.search(rf"^\s*(?:async def|def|class) {name}\b|^\s*{name}\b[^=\n]*=|"
                          rf"^from \S+ import .*\b{name}\b|^\s+{name},?$", text, re.M))


def wrong_names(text: str) -> list[str]:
    wrong = []
    for m in PATH.finditer(text):
        path = m.group(1).split(":")[0].split("::")[0]
        if path in NOT_FILES or (ROOT / path).exists():
            continue
        # pp1q_kernels/lazy_step.decide_rows: a file and a function in it
        stem, _, attr = path.rpartition(".")
        if attr and (ROOT / f"{stem}.py").is_file() and _defines(ROOT / f"{stem}.py", attr):
            continue
        wrong.append(path)
    for m in DOTTED.finditer(text):
        name = m.group(1)
        if name in NOT_MODULES:
            continue
        parts = name.split(".")
        for i in range(len(parts), 0, -1):  # the longest prefix that is a module
            if (f := _module_file(parts[:i])) is not None:
                break
        else:
            wrong.append(name)
            continue
        rest = parts[i:]
        if rest and not _defines(f, rest[0]):  # the first attribute; a class's own, unread
            wrong.append(name)
    return wrong


def test_every_path_and_module_the_docs_name_exists():
    wrong = {doc.name: w for doc in DOCS if (w := wrong_names(doc.read_text()))}
    assert wrong == {}


def test_the_check_catches_a_moved_file_a_module_and_an_attribute():
    planted = ("`pp1q/verifier/gate.py:Gate`, pp1q.verifier.ranks.leader, "
               "`pp1q.runtime.settings.MAX_SLOT`, pp1q.runtime.settings.MAX_SLOTS, "
               "`pp1q/worker/drafting.py:StepDrafter._run`")
    assert wrong_names(planted) == ["pp1q/verifier/gate.py", "pp1q.verifier.ranks.leader",
                                    "pp1q.runtime.settings.MAX_SLOT"]
