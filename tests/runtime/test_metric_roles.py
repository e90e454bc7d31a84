"""Each daemon exports only its own metric families, exactly those docs/operations.md
lists for its role ("verifier ranks" families are the verifier's)."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from daemon_harness import Pair
from prometheus_client.parser import text_string_to_metric_families

from pp1q.runtime.metrics import ROLES_OF

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
ROW = re.compile(r"^\| `(pp1q_[a-z_]+)(?:\{[^}]*\})?` \| (\w+) \| ([a-z ]+) \|")


def documented() -> dict[str, set[str]]:
    """role -> family names (counters without _total, info without _info) from the doc."""
    out: dict[str, set[str]] = {"verifier": set(), "worker": set()}
    for line in DOC.read_text().splitlines():
        m = ROW.match(line)
        if not m:
            continue
        name, kind, roles = m.groups()
        name = re.sub(r"_total$", "", name) if kind == "counter" else name
        name = re.sub(r"_info$", "", name) if kind == "info" else name
        for role in ("verifier", "worker"):
            if roles == "both" or roles.startswith(role):
                out[role].add(name)
    return out


def exported(port: int) -> set[str]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    names = {f.name for f in text_string_to_metric_families(text.decode())}
    # the text format's parser reads each counter's _created series as a family of its
    # own, and an info as a gauge named with its _info suffix
    return {n.removesuffix("_info") for n in names if n.startswith("pp1q_") and not (
        n.endswith("_created") and n.removesuffix("_created") in names)}


def test_the_doc_and_the_code_list_the_same_families():
    docs = documented()
    for role in ("verifier", "worker"):
        code = {f"pp1q_{n}" for n, roles in ROLES_OF.items() if role in roles}
        assert docs[role] == code, role


def test_each_daemon_exports_only_its_own_families(tmp_path):
    pair = Pair(tmp_path)
    try:
        pair.client().generate([1, 2], 4, seed=1)
        got = {role: exported(getattr(pair, role).metrics_port)
               for role in ("verifier", "worker")}
    finally:
        pair.close()
    docs = documented()
    assert got["verifier"] == docs["verifier"]
    assert got["worker"] == docs["worker"]
    assert "pp1q_steps" not in got["verifier"] and "pp1q_rounds" not in got["worker"]
