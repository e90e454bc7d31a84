"""K/V caches: a layer that appends in place (transformers' DynamicLayer with room to
grow), and what pp1q does with any cache (its length, a crop, its tensors, its bytes).

transformers' DynamicLayer appends a forward's keys and values with ``torch.cat`` of the
whole cache: a prompt prefilled in chunks copies its cache once per chunk (quadratic in
the prompt), and every one-token step copies it again. ``GrowingLayer`` keeps each of K
and V in a buffer with spare room along the sequence, writes a forward's new positions
into it in place, and exposes the first ``length`` positions as views (``keys`` and
``values``, what DynamicLayer's readers see); the buffer grows by ``GROWTH`` (new room,
one copy of what is held) only when an append does not fit. A crop narrows the views
(as DynamicLayer's does), and the next append overwrites the positions it dropped.

What a view returned before a crop shows is not kept: the next append writes over it.
Nothing here holds one across a crop (a forward's attention reads the views it was
given before anything else appends; a stacked round copies the K/V it takes).
"""

from __future__ import annotations

import torch

from pp1q.core.errors import LocalProtocolError, Reason

# the buffer's room after a grow: GROWTH times what is needed (amortised: each position
# is copied ~1 / (GROWTH - 1) = 2 times more over a prompt, where DynamicLayer copies it
# once per later append), and at least MIN_SPARE positions to spare (a short request's
# one-token steps); the memory held is at most GROWTH times the K/V's, plus MIN_SPARE
GROWTH = 1.5
MIN_SPARE = 16


def _layer_class():
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """DynamicLayer whose ``update`` writes into spare room instead of concatenating
        (module docstring); ``room`` is the buffer's length along the sequence."""

        def lazy_initialization(self, key_states: torch.Tensor,
                                value_states: torch.Tensor) -> None:
            super().lazy_initialization(key_states, value_states)
            self._k = self._v = None

        @property
        def room(self) -> int:
            return 0 if getattr(self, "_k", None) is None else self._k.shape[-2]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
                   **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            with torch.inference_mode():  # the buffers stay inference tensors, written inside
                held, new = self.get_seq_length(), key_states.shape[-2]
                need = held + new
                if not self._fits(key_states, value_states, held, need):
                    self._grow(key_states, value_states, held, need)
                self._k[..., held:need, :].copy_(key_states)
                self._v[..., held:need, :].copy_(value_states)
                self.keys = self._k[..., :need, :]
                self.values = self._v[..., :need, :]
            return self.keys, self.values

        def _fits(self, key_states, value_states, held: int, need: int) -> bool:
            """Whether the buffers take ``need`` positions of these states and still
            hold the ``held`` ones as the views show them (a layer whose views were
            replaced, e.g. reordered for a beam search, is copied into new buffers)."""
            k, v = self._k, self._v
            if k is None or need > k.shape[-2]:
                return False
            for buf, new, view in ((k, key_states, self.keys), (v, value_states, self.values)):
                if (buf.shape[:2] != new.shape[:2] or buf.shape[-1] != new.shape[-1]
                        or buf.dtype != new.dtype or buf.device != new.device):
                    return False
                if held and (view.data_ptr() != buf.data_ptr() or view.stride() != buf.stride()):
                    return False
            return True

        def _grow(self, key_states, value_states, held: int, need: int) -> None:
            room = max(int(need * GROWTH), need + MIN_SPARE)
            k = key_states.new_empty((*key_states.shape[:2], room, key_states.shape[-1]))
            v = value_states.new_empty((*value_states.shape[:2], room, value_states.shape[-1]))
            if held:
                k[..., :held, :].copy_(self.keys)
                v[..., :held, :].copy_(self.values)
            self._k, self._v = k, v

        def reset(self) -> None:
            super().reset()
            self._k = self._v = None

        def held_bytes(self) -> int:
            """The bytes the buffers take (spare room included)."""
            if getattr(self, "_k", None) is None:
                return 0
            return sum(t.numel() * t.element_size() for t in (self._k, self._v))

    return GrowingLayer


_GROWING = None


def growing_layer():
    """The GrowingLayer class (made once: transformers is imported on first use)."""
    global _GROWING
    if _GROWING is None:
        _GROWING = _layer_class()
    return _GROWING


def make_growing(cache) -> object:
    """``cache`` (a DynamicCache) with each plain DynamicLayer replaced by an empty
    GrowingLayer; other layer kinds (sliding windows) are left as they are."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if layers is None:  # transformers < 4.56: no layer API
        return cache
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and not layer.is_initialized:
            layers[i] = growing_layer()()
    return cache


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def crop(cache, keep: int) -> None:
    """Roll ``cache`` back to its first ``keep`` tokens (crop(-n) removes n in 4.x and 5.x)."""
    drop = cache_length(cache) - keep
    if drop < 0:
        raise LocalProtocolError(Reason.BAD_POSITION, f"cannot keep {keep} of {keep + drop}")
    if drop:
        cache.crop(-drop)


def kv_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values), each [B, kv_heads, length, head_dim]; [] when empty."""
    if cache_length(cache) == 0:
        return []
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers < 4.56


def cache_bytes(cache) -> int:
    """The bytes the K/V ``cache`` holds: its layers' buffers where they append in place
    (spare room included, pp1q.models.hf_cache), else its tokens' K/V (a cropped plain
    layer may keep its longer storage alive until its next append)."""
    layers = getattr(cache, "layers", None)
    if layers and all(hasattr(layer, "held_bytes") for layer in layers):
        return sum(layer.held_bytes() for layer in layers)
    return sum(t.numel() * t.element_size() for pair in kv_tensors(cache) for t in pair)
