"""hf_attention's functions called as transformers may call them, beyond SmolLM2's
causal self-attention (found by review): a V head size unlike K's (MLA models, e.g.
DeepSeek-V3's q/k 192 and v 128) is attended as transformers' sdpa function would
(the CPU flash kernel of the split takes one head size); a bidirectional mask with more
keys than queries is built, not read as a causal skip; a module that is not causal is
never attended causally. Each compares with transformers' own sdpa function, and each
failed before the fix (a RuntimeError, an AttributeError, a 4.6e-3 difference)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from pp1q.models import hf_attention as ha  # noqa: E402


class _Module(torch.nn.Module):
    num_key_value_groups = 2

    def __init__(self, is_causal: bool = True) -> None:
        super().__init__()
        self.is_causal = is_causal


def _qkv(dv: int = 16, past: int = ha.MIN_PAST, t: int = 3):
    """A 3-query chunk on ``past`` earlier keys: 4 query heads on 2 K/V heads."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, t, 16, generator=g)
    k = torch.randn(1, 2, past + t, 16, generator=g)
    v = torch.randn(1, 2, past + t, dv, generator=g)
    return q, k, v


def _sdpa(module, q, k, v, mask):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)[0]


def test_a_chunk_whose_value_heads_differ_from_its_keys_is_attended():
    q, k, v = _qkv(dv=8)
    mask = torch.ones(3, k.shape[2], dtype=torch.bool).tril(k.shape[2] - 3)[None, None]
    got, _ = ha.chunk_attention(_Module(), q, k, v, None, scaling=0.25)
    assert (got - _sdpa(_Module(), q, k, v, mask)).abs().max() < 1e-5


def test_a_bidirectional_mask_with_more_keys_than_queries_is_built():
    from transformers.masking_utils import bidirectional_mask_function

    mask = ha.chunk_mask(batch_size=1, q_length=3, kv_length=10,
                         mask_function=bidirectional_mask_function, attention_mask=None,
                         allow_is_causal_skip=False, allow_is_bidirectional_skip=True)
    assert mask is not None and bool(mask.all())  # every query sees every key


def test_a_module_that_is_not_causal_is_not_attended_causally():
    q, k, v = _qkv()
    got, _ = ha.chunk_attention(_Module(False), q, k, v, None, scaling=0.25)
    assert (got - _sdpa(_Module(False), q, k, v, None)).abs().max() < 1e-5
