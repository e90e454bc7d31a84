"""The docs and the metric registries agree, without starting a daemon: every
family a daemon's registry exports is in docs/operations.md's Metrics table for that
daemon with its type and label names, every family the table lists is exported by the
daemon it names, and every `pp1q_...` name written anywhere in README.md, docs/,
RELIABILITY.md and BENCHMARKS.md (prose, tables, label values) is a real family with
real label values. Both roles' registries are built from pp1q.runtime.metrics, so
families added there (by either daemon's work) are checked as soon as they exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase
from test_metric_roles import documented

from pp1q.core.errors import Reason
from pp1q.core.outcomes import FallbackCause, PeerRefusal, PrefillOutcome, RankFailure, StepKind
from pp1q.runtime.metrics import ROLES_OF, Metrics

ROOT = Path(__file__).resolve().parents[2]
# every page that names metrics: operations.md's table is the reference, the others
# (security.md's refusal counters, deploy.md's alerts, README) were unchecked and could drift
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "RELIABILITY.md",
        ROOT / "BENCHMARKS.md"]
PACKAGES = {"pp1q_kernels"}  # a package named in prose (`pp1q_kernels/`), not a metric
# a metric name, not a module path such as pp1q_kernels.shard_step
NAME = re.compile(r"\b(pp1q_[a-z0-9_]++)(?!\.\w)(\{[^}]*\})?")
LABEL = re.compile(r'(\w+)="([^"]*)"')
SUFFIXES = ("_total", "_info", "_bucket", "_sum", "_count", "_created")
# closed label sets (pp1q.runtime.metrics): a value the code can never write is a doc bug
LABEL_VALUES = {
    "reason": {r.value for r in Reason} | {p.value for p in PeerRefusal},
    "cause": {c.value for c in FallbackCause} | {f.value for f in RankFailure},
    "kind": {k.value for k in StepKind},
    "outcome": {"ok", "error", "left_queued"} | {o.value for o in PrefillOutcome},
    "mode": {"off", "greedy", "sampled"},
}


def registry_families(role: str) -> dict[str, set[str]]:
    """family name (counters without _total, infos without _info) -> its label names,
    for every family the role's registry exports."""
    m = Metrics(role)
    exported = {fam.name for fam in m.registry.collect()}
    labels = {w._name: set(w._labelnames) for w in vars(m).values()
              if isinstance(w, MetricWrapperBase)}
    return {name: labels.get(name, set()) for name in exported}


def family_of(name: str, known: set[str]) -> str | None:
    if name in known:
        return name
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in known:
            return name.removesuffix(suffix)
    return None


@pytest.mark.parametrize("role", ["verifier", "worker"])
def test_every_exported_family_is_documented_for_its_daemon_and_back(role):
    exported = set(registry_families(role))
    listed = documented()[role]
    assert exported - listed == set(), f"{role} exports these, the doc's table does not list them"
    assert listed - exported == set(), f"the doc lists these for {role}; it does not export them"


def wrong_names(text: str) -> list[str]:
    """Every `pp1q_...` name (and label value) in ``text`` that no daemon exports."""
    families = {**registry_families("worker"), **registry_families("verifier")}
    wrong = []
    for m in NAME.finditer(text):
        name, labels = m.group(1), m.group(2) or ""
        if name in PACKAGES:
            continue
        fam = family_of(name, set(families))
        if fam is None:
            wrong.append(name)
            continue
        for key, val in LABEL.findall(labels):
            if key not in families[fam] or (key in LABEL_VALUES and val
                                            and val not in LABEL_VALUES[key]):
                wrong.append(f"{name}{{{key}={val!r}}}")
    return wrong


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_metric_named_in_the_docs_exists_with_real_labels(doc):
    wrong = wrong_names(doc.read_text())
    assert not wrong, f"{doc.name} names metrics or labels that do not exist: {wrong}"


def test_the_check_catches_a_stale_name_and_a_wrong_label():
    planted = ('`pp1q_fallback_total` and `pp1q_fallbacks_total{cause="wachdog_timeout"}`, '
               '`pp1q_steps_total{reason="checksum_mismatch"}`, `pp1q_accepted_length_sum`')
    assert wrong_names(planted) == [
        "pp1q_fallback_total", "pp1q_fallbacks_total{cause='wachdog_timeout'}",
        "pp1q_steps_total{reason='checksum_mismatch'}"]


# a row of the doc's Metrics table: name, its label names in braces, the type column
TABLE_ROW = re.compile(r"^\| `(pp1q_[a-z0-9_]+)(?:\{([a-z_, ]*)\})?` \| (\w+) \|", re.M)


def table_mismatches(table: str) -> list[str]:
    """Each row of ``table`` whose type column or label names differ from the family
    the registries export (an info's braces name the keys its daemon sets: not checked)."""
    kinds, labels = {}, {}
    for role in ("verifier", "worker"):
        for fam in Metrics(role).registry.collect():
            kinds[fam.name] = fam.type
        labels.update(registry_families(role))
    wrong = []
    for name, named, kind in TABLE_ROW.findall(table):
        fam = family_of(name, set(kinds))
        if fam is None:
            wrong.append(f"{name}: not exported")
            continue
        if kinds[fam] != kind:
            wrong.append(f"{name}: type {kind}, exported as {kinds[fam]}")
        stated = {n.strip() for n in named.split(",") if n.strip()}
        if kind != "info" and stated != labels[fam]:
            wrong.append(f"{name}: labels {sorted(stated)}, exported {sorted(labels[fam])}")
    return wrong


def test_the_metrics_table_states_each_family_s_type_and_label_names():
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text.split("\n## Metrics", 1)[1].split("\n## ", 1)[0]
    assert len(TABLE_ROW.findall(table)) == len(ROLES_OF)  # every family has its row
    assert table_mismatches(table) == []


def test_the_table_check_catches_a_wrong_type_and_a_missing_label():
    planted = ("| `pp1q_rounds_total` | counter | verifier | no kind label |\n"
               "| `pp1q_circuit_state` | counter | verifier | a gauge |\n"
               "| `pp1q_steps_total{reason}` | counter | worker | no such label |\n"
               "| `pp1q_slots_in_use` | gauge | both | right |\n")
    assert table_mismatches(planted) == [
        "pp1q_rounds_total: labels [], exported ['kind']",
        "pp1q_circuit_state: type counter, exported as gauge",
        "pp1q_steps_total: labels ['reason'], exported []"]
