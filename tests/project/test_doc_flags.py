"""Every option the docs name is one a pp1q command takes: in a `pp1q COMMAND ...` line
(a code block's or an inline span's), each --option is that command's; anywhere else, an
--option is some command's, or another tool's named below. Builds the parsers only."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

from pp1q.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "RELIABILITY.md",
        ROOT / "BENCHMARKS.md"]
# options of the other tools the docs show (pip, pytest, useradd, systemctl, torchrun,
# valgrind)
OTHER_TOOLS = {"--index-url", "--no-deps", "--pdb", "--runslow", "--dist", "--home-dir",
               "--shell", "--system", "--now", "--nproc-per-node", "--max-restarts", "--tool"}
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
# `pp1q CMD ...` inline, or a code-block line (with its backslash continuations)
INLINE = re.compile(r"`(?:pp1q|python3 -m pp1q\.cli) ([a-z-]+)([^`]*)`")
BLOCK = re.compile(r"^ {4,}(?:\S+/)?(?:pp1q|python3 -m pp1q\.cli|torchrun .*?-m pp1q\.cli) "
                   r"([a-z-]+)((?:.*\\\n)*.*)$", re.M)


def _walk(p: argparse.ArgumentParser) -> set[str]:
    """A parser's options and its subcommands' (`pp1q chaos proxy --fault ...`)."""
    found = set()
    for a in p._actions:
        found.update(a.option_strings)
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                found |= _walk(sub)
    return found


def _options(cmd: str) -> set[str]:
    p = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[cmd]).add_arguments(p)
    return _walk(p)


def wrong_options(text: str) -> list[str]:
    known = {cmd: _options(cmd) for cmd in COMMANDS}
    every = set().union(*known.values())
    wrong = []
    for m in [*INLINE.finditer(text), *BLOCK.finditer(text)]:
        cmd, rest = m.group(1), m.group(2).split(" #")[0]
        if cmd not in COMMANDS:
            if not cmd.isupper():  # `pp1q COMMAND`: the placeholder
                wrong.append(f"pp1q {cmd}: no such command")
            continue
        wrong += [f"pp1q {cmd} {o}" for o in OPTION.findall(rest) if o not in known[cmd]]
    wrong += [o for o in OPTION.findall(text) if o not in every | OTHER_TOOLS]
    return wrong


def test_every_option_in_the_docs_exists_for_its_command():
    wrong = {doc.name: w for doc in DOCS if (w := wrong_options(doc.read_text()))}
    assert wrong == {}


def test_the_check_catches_a_stale_option_and_one_of_another_command():
    planted = ("    pp1q worker --listen 127.0.0.1:7070 \\\n        --slots 4\n"
               "`pp1q verifier --watchdog-s 2`, `pp1q replay --reverify FILE`, `pp1q serve`\n"
               "and `--draft-adapters` in prose\n")
    assert wrong_options(planted) == ["pp1q verifier --watchdog-s", "pp1q serve: no such command",
                                      "pp1q worker --slots", "--watchdog-s", "--draft-adapters"]
