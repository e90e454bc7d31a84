"""hf_attention: a chunk's attention split in two and merged is the masked attention.

The reference is SDPA with K/V repeated to every query head and the explicit mask
(transformers' sdpa path for a chunk, before the split): in float64 the two agree to
~1e-15, so a merge weighting the parts wrongly, a causal edge off by one or a query
head reading another head's K/V (differences of whole units) cannot pass. The real
model's chunked prefill through the split is checked in test_hf_target.py.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

from pp1q.models import hf_attention
from pp1q.models.hf_attention import lower_right_causal, split_attention

TOL64, TOL32 = 1e-12, 1e-5
SHAPES = [  # B, H, KVH, T, L, D
    (1, 9, 3, 128, 400, 64),  # SmolLM2-135M's heads, a chunk on 272 cached
    (2, 4, 2, 5, 17, 8),
    (1, 6, 6, 3, 4, 16),  # no grouping; one key before the queries
    (1, 4, 1, 7, 8, 8),
    (1, 8, 2, 1, 9, 32),  # one query
]


def _masked(q, k, v, scale):
    group = q.shape[1] // k.shape[1]
    t, length = q.shape[2], k.shape[2]
    mask = torch.ones(t, length, dtype=torch.bool).tril(length - t)
    return sdpa(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                attn_mask=mask, scale=scale)


def _worst(dtype) -> float:
    torch.manual_seed(3)
    worst = 0.0
    for b, h, kvh, t, length, d in SHAPES:
        q = torch.randn(b, t, h, d, dtype=dtype).transpose(1, 2)  # as transformers has it
        k, v = (torch.randn(b, kvh, length, d, dtype=dtype) * 2 for _ in range(2))
        for scale in (None, 0.3):
            out = split_attention(q, k, v, scale)
            assert out.shape == q.shape and out.dtype == dtype
            worst = max(worst, float((out - _masked(q, k, v, scale)).abs().max()))
    return worst


def test_split_equals_masked_attention():
    assert _worst(torch.float64) <= TOL64
    assert _worst(torch.float32) <= TOL32


def _equal_shares(out_p, lse_p, out_c, lse_c):
    return (out_p + out_c) / 2


def _swapped_shares(out_p, lse_p, out_c, lse_c):
    share = torch.sigmoid(lse_p - lse_c).unsqueeze(-1)
    return torch.lerp(out_p, out_c, share)


@pytest.mark.parametrize("wrong", [_equal_shares, _swapped_shares])
def test_a_wrong_merge_is_rejected(monkeypatch, wrong):
    monkeypatch.setattr(hf_attention, "merge", wrong)
    assert _worst(torch.float64) > 1e-3


def test_a_wrong_causal_edge_or_head_is_rejected(monkeypatch):
    real = hf_attention._flash

    def shifted(q, k, v, dropout, causal, scale=None):  # the chunk's keys one further
        if causal:
            k, v = k.roll(1, 2), v.roll(1, 2)
        return real(q, k, v, dropout, causal, scale=scale)

    monkeypatch.setattr(hf_attention, "_flash", shifted)
    assert _worst(torch.float64) > 1e-3
    monkeypatch.setattr(hf_attention, "_flash", real)
    torch.manual_seed(4)
    q, k, v = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8)
    wrong_heads = sdpa(  # head h reading K/V head h % KVH
        q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1),
        attn_mask=torch.ones(6, 20, dtype=torch.bool).tril(14))
    assert float((split_attention(q, k, v) - wrong_heads).abs().max()) > 1e-3


def test_only_the_end_aligned_causal_mask_is_recognised():
    t, length = 4, 10
    chunk = torch.ones(t, length, dtype=torch.bool).tril(length - t)[None, None]
    assert lower_right_causal(chunk) and lower_right_causal(chunk.expand(3, 1, t, length))
    assert not lower_right_causal(torch.ones(t, length, dtype=torch.bool).tril()[None, None])
    padded = chunk.clone()
    padded[0, 0, :, 0] = False  # a left pad
    assert not lower_right_causal(padded)
    wider = chunk.clone()
    wider[0, 0, 0, length - t + 1] = True  # the first query sees the next one
    assert not lower_right_causal(wider)
    assert not lower_right_causal(torch.zeros(1, 1, t, length).masked_fill(~chunk, -1e9))


def test_chunk_mask_says_none_only_for_a_chunk_past_min_past():
    pytest.importorskip("transformers")
    from pp1q.models.hf_attention import MIN_PAST, chunk_mask

    def mask(q, kv, pad=None):
        return chunk_mask(batch_size=1, q_length=q, kv_length=kv, q_offset=kv - q,
                          attention_mask=pad)

    assert mask(128, 128 + MIN_PAST) is None  # a chunk: the split
    assert mask(1, 9000) is None and mask(300, 300) is None  # sdpa's own: is_causal
    short = mask(128, 128 + MIN_PAST - 1)  # too little past to pay: the mask as before
    assert short is not None and lower_right_causal(short)
    pad = torch.ones(1, 128 + MIN_PAST, dtype=torch.bool)
    pad[0, 0] = False  # a stacked round's left pad: the mask, with the pad
    padded = mask(128, 128 + MIN_PAST, pad)
    assert padded is not None and not bool(padded[0, 0, :, 0].any())


def test_chunk_attention_is_transformers_sdpa_without_the_expansion():
    # every case the registered function sees, against transformers' own sdpa function
    # given the mask the chunk means: a whole prompt and a one-token step (no mask), a
    # chunk (no mask: causal aligned to the end; the split) and a padded mask (SDPA with
    # enable_gqa); the output [B, T, H, D] as transformers' is
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from pp1q.models.hf_attention import chunk_attention

    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    torch.manual_seed(6)
    for t, length, pad in [(9, 9, 0), (1, 12, 0), (5, 12, 0), (5, 12, 3), (1, 12, 2)]:
        q = torch.randn(2, t, 6, 16, dtype=torch.float64).transpose(1, 2)
        k, v = (torch.randn(2, 2, length, 16, dtype=torch.float64) for _ in range(2))
        mask = torch.ones(t, length, dtype=torch.bool).tril(length - t).repeat(2, 1, 1, 1)
        mask[1, :, :, :pad] = False  # the second row left-padded
        given = mask if pad else None
        want, _ = sdpa_attention_forward(module, q, k, v, mask if 1 < t < length or pad
                                         else None, scaling=0.25)
        got, _ = chunk_attention(module, q, k, v, given, scaling=0.25)
        assert got.shape == (2, t, 6, 16)
        assert float((got - want).abs().max()) <= TOL64, (t, length, pad)


def test_the_flash_op_is_checked_before_it_is_used():
    # the op is not public API: one missing, refusing or computing another LSE is refused
    # at import and chunks take SDPA with the mask
    real = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    assert hf_attention._flash is not None and hf_attention.usable(real)

    def log2_lse(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        return out, lse / 0.6931471805599453

    def refusing(*args, **kwargs):
        raise RuntimeError("no such overload")

    assert not any(hf_attention.usable(op) for op in (None, log2_lse, refusing))
