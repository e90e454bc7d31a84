"""Shared by the deploy tests: where deploy/ is, the Prometheus tools, metric names.

Tests that need promtool or prometheus (Debian's ``prometheus`` package, installed by
``scripts/install.sh test``) FAIL when the binary is missing, so CI cannot pass by
skipping them; set PP1Q_NO_PROMETHEUS=1 to skip them deliberately on a machine that
cannot have the package.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pp1q.runtime.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NO_PROMETHEUS_ENV = "PP1Q_NO_PROMETHEUS"
SAMPLE_SUFFIXES = {  # prometheus_client family type -> sample name suffixes
    "counter": ("_total",), "gauge": ("",), "info": ("_info",),
    "histogram": ("_bucket", "_sum", "_count"),
}


def prometheus_tool(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    if os.environ.get(NO_PROMETHEUS_ENV) == "1":
        pytest.skip(f"{name} deliberately unavailable ({NO_PROMETHEUS_ENV}=1)")
    pytest.fail(f"{name} not found: install Debian's prometheus package "
                f"(`bash scripts/install.sh test` does), or set {NO_PROMETHEUS_ENV}=1 to "
                "skip the Prometheus checks deliberately")


def exported_names() -> set[str]:
    """Every sample name the daemons' metrics can expose (both roles)."""
    names = set()
    for role in ("worker", "verifier"):
        for family in Metrics(role).registry.collect():
            names.update(family.name + s for s in SAMPLE_SUFFIXES.get(family.type, ("",)))
    return names
