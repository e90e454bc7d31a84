"""A real drafter's own context reaches the verifier: the worker offers it at HELLO as
``max_context`` (the verifier then runs target-only the rounds whose drafts would pass
it: tests/verifier/test_context_bound.py), a drafter with none of its own (the toy)
offers the wire's default."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pp1q.models import serving
from pp1q.runtime.settings import WorkerSettings
from pp1q.wire.limits import DEFAULT_MAX_CONTEXT
from pp1q.worker import daemon


def _loaded(max_positions: int | None) -> serving.Loaded:
    """What load_drafter returns, with a stand-in engine (no weights are loaded)."""
    return serving.Loaded(engine=SimpleNamespace(variant="stand-in"), tokenizer=None,
                          tokenizer_digest="t" * 64, vocab=64, draft_id="draft:x",
                          target_id="target:x", load_seconds=0.0,
                          max_positions=max_positions)


@pytest.mark.parametrize("positions, offered", [
    (300, 300),  # a draft checkpoint with a context shorter than the wire's default
    (None, DEFAULT_MAX_CONTEXT),  # its config names none
    (DEFAULT_MAX_CONTEXT * 4, DEFAULT_MAX_CONTEXT),  # longer than the wire's bound
])
def test_the_worker_offers_its_drafters_context(monkeypatch, positions, offered):
    monkeypatch.setattr(daemon, "load_drafter", lambda settings: _loaded(positions))
    config, _engine, _metrics = daemon.build(WorkerSettings(model="/stand-in.gguf"))
    assert config.limits.max_context == offered


def test_the_toy_drafter_offers_the_wires_default():
    config, _drafter, _metrics = daemon.build(WorkerSettings())
    assert config.limits.max_context == DEFAULT_MAX_CONTEXT
