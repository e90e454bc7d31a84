"""Helpers for the real-model tests in tests/models (conftest.py there has the fixtures)."""

from __future__ import annotations

import subprocess

import torch

from pp1q.runtime.launcher import daemon_env, pp1q_command

RUN_TIMEOUT_S = 600  # two daemons loading torch and the model on 2 shared cores

STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


def full_logits(model, ids) -> torch.Tensor:
    """Uncached reference: one forward of the whole sequence, float32 [len(ids), V]."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([list(ids)], device=model.device)).logits[0].float()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.double().cpu() - b.double().cpu()).abs().max())


def run_pp1q(cache_home, *args: str) -> subprocess.CompletedProcess:
    """``pp1q ARGS`` in a child process that finds the model in ``cache_home`` (the
    conftest fixture: an XDG_CACHE_HOME holding the de-quantized model)."""
    env = {**daemon_env(), "XDG_CACHE_HOME": str(cache_home)}
    return subprocess.run(pp1q_command(*args), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env=env)
