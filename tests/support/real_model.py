"""Helpers for the real-model tests in tests/models (conftest.py there has the fixtures)."""

from __future__ import annotations

import torch

STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


def full_logits(model, ids) -> torch.Tensor:
    """Uncached reference: one forward of the whole sequence, float32 [len(ids), V]."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([list(ids)], device=model.device)).logits[0].float()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.double().cpu() - b.double().cpu()).abs().max())
