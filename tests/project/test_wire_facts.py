"""Each wire fact is stated once, by pp1q/wire: the frame header layout (framing.HEADER)
and the magic. Nobody else spells them out, and nothing sniffs a protocol: since wire v2
revision 2 a worker port speaks one protocol (the context channel and its preamble are
gone, and no copy of them may come back)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNERS = {ROOT / "pp1q" / "wire" / "framing.py"}
COPIES = {
    "header struct format": re.compile(r"""["']<4s"""),
    "wire magic literal": re.compile(r"""b["']PP1Q["']"""),
    "context preamble literal": re.compile(r"""b["']PP1CTX"""),
    "hand-made protocol sniff": re.compile(r"""[=!]=\s*(cc\.)?PREAMBLE\b|startswith\(\w*MAGIC"""),
    "a protocol sniffer": re.compile(r"""\bsniff\(|\bSNIFF_BYTES\b|context_channel"""),
    "a second fault proxy": re.compile(r"^class FaultProxy\b", re.M),
}


def _sources():
    for top in ("pp1q", "fuzz", "tests", "pp1q_kernels"):
        yield from (p for p in (ROOT / top).rglob("*.py") if p not in OWNERS)


def test_no_copy_of_a_wire_fact_outside_pp1q_wire():
    found = []
    for path in _sources():
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        for what, pattern in COPIES.items():
            if what == "a second fault proxy" and path.parts[-4:-1] == ("pp1q", "tools", "chaos"):
                continue
            found += [f"{path.relative_to(ROOT)}: {what}" for _ in pattern.finditer(text)]
    assert not found, found
