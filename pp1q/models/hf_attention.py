"""A chunk's attention on the CPU: K/V never expanded, past the mask where it pays.

A long prompt is prefilled in chunks (``PREFILL_CHUNK`` ids, pp1q.models.engine), each
chunk's queries attending to the whole cache before them and causally to each other.
transformers' ``sdpa`` path cannot say that with ``is_causal`` (SDPA aligns it to the
top-left, and the chunk sits at the end of the keys), so it passes an explicit
[B, 1, T, L] mask, and with a mask it expands grouped-query attention's K/V to every
query head (3 to 9 heads for SmolLM2-135M) over the whole cache, in every layer, for
every chunk; SDPA then turns the boolean mask into a float one, again per layer.

Two remedies, each where it measured best. With a mask, SDPA's ``enable_gqa`` runs the
CPU flash kernel on the K/V heads as they are (no expansion). Past ``MIN_PAST`` cached
keys, ``split_attention`` drops the mask too: the same softmax in two parts with the CPU
flash kernel, which returns each part's log-sum-exp: the queries against the keys
before the chunk (no mask; the group of query heads sharing one K/V head folded into
that head's query rows), and against the chunk's own keys (``is_causal``, where top-left
is right: as many queries as keys), merged exactly by their shares of the softmax's
denominator (``merge``), the float sums in another order than one masked pass
(differences of ~1e-7 on random inputs).

Wired through transformers' public registries under ``ATTENTION`` (chosen for a model
on the CPU at load, pp1q.models.hf): ``chunk_mask`` builds sdpa's mask, then returns
None when that mask is exactly "causal, aligned to the end of the keys" on at least
``MIN_PAST`` earlier keys, and ``chunk_attention`` reads None that way: a whole prompt
(as many queries as keys) and a one-token step go to transformers' own sdpa function
unchanged (is_causal or no mask, K/V not expanded: already its best path), a chunk to
``split_attention``, and any mask (a shorter chunk, padding in a stacked round) to SDPA
with ``enable_gqa``. A verifier round on a long cache (the last committed token and the
drafts) and a drafter's two-token step are chunks too.

Measured on a 2-core AMD EPYC shared with another job, one torch thread (BENCHMARKS.md,
"Chunked prefill"). One layer's attention, microseconds (today's K/V expanded + mask /
``enable_gqa`` + mask / split): 128 queries on 4,096 keys 25,476 / 23,159 / 21,064;
on 1,152 keys 6,773 / 6,037 / 5,742; 6 queries on 3,974 keys 5,705 / 2,270 / 1,566;
on 262 keys 250 / 145 / 253; 2 queries on 34 keys 65 / 31 / 121. A 4,096-id prompt
prefilled in 128-id chunks through HFTarget, CPU seconds: transformers' sdpa 27.49 /
25.62 / 29.93 / 30.61, this module's 22.93 / 22.47 / 28.01 / 25.80 (alternated: 13%
less; 9-20% over five sittings, the ``enable_gqa`` path alone within the noise of the
split), logits within 3e-5 of sdpa's; the drafter's (28 layers) 8% less.
``_scaled_dot_product_flash_attention_for_cpu`` is an aten op torch does not document:
it is checked once at import (``usable``), and where it is missing, refuses or differs,
chunks take the ``enable_gqa`` path with the mask.
"""

from __future__ import annotations

import torch

ATTENTION = "pp1q_chunk_sdpa"  # the name registered with transformers for both functions
# keys before the queries from which the split pays: two kernel calls and a merge cost
# ~0.1 ms a layer more than one masked call with ``enable_gqa``, which the mask's cost
# passes at ~1,000 keys (one thread; a round of 2-6 queries and a 128-query chunk alike)
MIN_PAST = 1024


def split_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    scale: float | None = None, flash=None) -> torch.Tensor:
    """Causal attention of ``query`` [B, H, T, D] on ``key``/``value`` [B, KVH, L, D]
    (L > T; H a multiple of KVH, query head h reading K/V head h // (H // KVH)), the
    queries being the last T of the L positions: [B, H, T, D], as SDPA with the mask
    ``tril(ones(T, L), L - T)`` gives it. CPU tensors; ``flash``: the kernel (output
    and log-sum-exp; this module's checked one when None)."""
    kernel = flash or _flash
    b, h, t, d = query.shape
    kvh, past = key.shape[1], key.shape[2] - t
    group = h // kvh
    # the past: every query sees every key; a K/V head's group of query heads as rows
    out_p, lse_p = kernel(query.reshape(b, kvh, group * t, d), key[:, :, :past],
                          value[:, :, :past], 0.0, False, scale=scale)
    out_p, lse_p = out_p.reshape(b, h, t, d), lse_p.reshape(b, h, t)
    # the chunk's own keys: as many as queries, so top-left causal is the right causal
    out_c, lse_c = kernel(query, key[:, :, past:], value[:, :, past:], 0.0, True,
                          scale=scale)
    return merge(out_p, lse_p, out_c, lse_c).to(query.dtype)


def merge(out_p: torch.Tensor, lse_p: torch.Tensor, out_c: torch.Tensor,
          lse_c: torch.Tensor) -> torch.Tensor:
    """One softmax's output from two disjoint parts of its keys, each part's output
    [..., T, D] and log-sum-exp [..., T]: weighted by their shares of the denominator,
    e^lse_c / (e^lse_p + e^lse_c) for the second (in the LSE's dtype, float32 or wider)."""
    share = torch.sigmoid(lse_c - lse_p).unsqueeze(-1)
    return torch.lerp(out_p.to(share.dtype), out_c.to(share.dtype), share)


def usable(op) -> bool:
    """Whether ``op`` gives ``split_attention`` what it needs (the attention and its
    natural-log LSE, with these arguments), checked on a small case against SDPA with
    the mask: the op is not public API, and one missing, refusing or different is not
    used (chunks then take SDPA with the mask)."""
    if op is None:
        return False
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, n, 8, generator=g) for n in (3, 7, 7))
    k, v = k[:, :2], v[:, :2]
    mask = torch.ones(3, 7, dtype=torch.bool).tril(4)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
    try:
        got = split_attention(q, k, v, 0.3, flash=op)
    except Exception:  # noqa: BLE001 - any refusal means: not this op
        return False
    return got.shape == want.shape and bool((got - want).abs().max() <= 1e-5)


_flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_flash = _flash if usable(_flash) else None


def lower_right_causal(mask: torch.Tensor) -> bool:
    """Whether a boolean [B, 1, T, L] mask is exactly causal aligned to the end of the
    keys (query i sees keys 0..L - T + i): a chunk on an unpadded cache."""
    t, length = mask.shape[-2:]
    want = torch.ones(t, length, dtype=torch.bool, device=mask.device).tril(length - t)
    return mask.dtype == torch.bool and torch.equal(mask, want.expand(mask.shape))


def chunk_mask(*args, **kwargs):
    """sdpa's mask (transformers' ``sdpa_mask``), None where it is causal aligned to the
    end of the keys; ``chunk_attention`` reads None that way."""
    from transformers.masking_utils import sdpa_mask

    mask = sdpa_mask(*args, **kwargs)
    if mask is None:
        q, kv = kwargs.get("q_length"), kwargs.get("kv_length")
        if q is None or kv is None or q == 1 or q == kv:
            return None  # one query sees every key; or is_causal over equal lengths
        # sdpa's None with more keys than queries means top-left (a static cache): say so
        # (and a bidirectional skip is no causal one: a mask materialised either way)
        off = {"allow_is_causal_skip": False}
        if "allow_is_bidirectional_skip" in kwargs:  # a keyword older releases lack
            off["allow_is_bidirectional_skip"] = False
        mask = sdpa_mask(*args, **{**kwargs, **off})
    past = mask.shape[-1] - mask.shape[-2]
    return None if past >= MIN_PAST and lower_right_causal(mask) else mask


def chunk_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                    scaling: float | None = None, **kwargs):
    """transformers' sdpa function, but on the CPU a chunk (more keys than queries, no
    mask: the mask was causal aligned to the end) through ``split_attention``, and a
    mask given to SDPA with ``enable_gqa`` (K/V not expanded). The end-aligned reading of
    a None mask is ours, not transformers' (whose None with more keys than queries is
    top-left): it holds because ``chunk_mask`` is where such a None comes from."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    t, length = query.shape[2], key.shape[2]
    causal = kwargs.get("is_causal")
    if not (getattr(module, "is_causal", True) if causal is None else causal):
        # not causal (cross-attention, a bidirectional layer): a None mask means no mask
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    plain = (query.device.type == "cpu" and dropout == 0.0 and query.shape[1] % key.shape[1] == 0
             and kwargs.get("position_bias") is None and kwargs.get("softcap") is None)
    if attention_mask is None and 1 < t < length:
        if plain and _flash is not None and key.shape[-1] == value.shape[-1]:  # flash: one
            # head size for Q, K and V (an MLA model's V differs: the masked path below)
            return split_attention(query, key, value, scaling).transpose(1, 2).contiguous(), None
        attention_mask = torch.ones(t, length, dtype=torch.bool,  # not for the kernel: say it
                                    device=query.device).tril(length - t)[None, None]
    if attention_mask is not None and plain:
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask,
                                  dropout=dropout, scaling=scaling, **kwargs)


def register() -> str:
    """Register ``ATTENTION`` with transformers (idempotent); its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, chunk_attention)
    AttentionMaskInterface.register(ATTENTION, chunk_mask)
    return ATTENTION
