"""Drafters over Hugging Face causal LMs: a second checkpoint, or the target's early exit.

``HFDrafter`` runs any causal LM incrementally with one DynamicCache per request and
the shared ``Ledger`` rules: a row costs one forward of the tokens not yet cached
(usually one; two at the start of a round after a bonus). Drafting is batch size 1
per request on purpose: rows are produced one at a time, in order, and each q must be
built from exactly the logits that row's forward returned.

Early exit (LayerSkip-style): the first k decoder layers of the target checkpoint,
then the checkpoint's own final norm and LM head; optionally an exit adapter (an affine
map fitted by ``pp1q train-adapter``, pp1q.models.exit_adapter) before the norm. ``early_exit_view``
builds a model object that shares those parameters (read-only; nothing here trains)
but has its own module list and config, so the full model it came from is untouched
and its per-request caches are never shared. With k equal to the layer count it is the
target itself, which is what the tests use to check that positions, caches and
processors line up (acceptance ~100%).
"""

from __future__ import annotations

import copy

import torch

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.models.engine import Drafter, RequestKey
from pp1q.models.exit_adapter import AdaptedNorm, ExitAdapter, check_fits
from pp1q.models.hf import Checkpoint, HFRole, load_checkpoint
from pp1q.models.hf_cache import crop
from pp1q.models.hf_requests import LedgerCaches


def _decoder(model):
    """The decoder stack holding ``layers`` and ``norm`` (``model.model`` for Llama-likes)."""
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    if not hasattr(inner, "layers") or not hasattr(inner, "norm"):
        raise LocalProtocolError(Reason.UNSUPPORTED_FEATURE,
                                 f"{type(model).__name__}: no decoder layers/norm to exit from")
    return inner


def num_layers(model) -> int:
    return len(_decoder(model).layers)


def hidden_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[1])


def exit_identity(ckpt: Checkpoint, k: int, adapter: ExitAdapter | None) -> str:
    """What an early-exit drafter names at HELLO (the verifier computes the same); a map
    fitted for another checkpoint, exit or width is refused here, on both sides."""
    tail = ""
    if adapter is not None:
        check_fits(adapter, ckpt.identity, k, hidden_size(ckpt.model))
        tail = f":{adapter.tag}"
    return f"{ckpt.identity}:early-exit={k}/{num_layers(ckpt.model)}{tail}"


def early_exit_view(model, k: int, adapter: ExitAdapter | None = None):
    """A causal LM running only the first ``k`` decoder layers of ``model``.

    Shallow copies of the outer and decoder modules with a new module dict: parameters
    are the same tensors (no copy, no extra memory), the layer list is a new
    ``ModuleList`` of the first k layers and the config is a copy with k layers (the
    decoder's forward loops over ``config.num_hidden_layers`` layers, and DynamicCache
    sizes itself from the config). With an ``adapter`` the view's final norm is
    ``AdaptedNorm`` (the map, then the checkpoint's own norm): the decoder applies its
    norm once, after its last layer, which is exactly where the map belongs.
    """
    inner = _decoder(model)
    total = len(inner.layers)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= total:
        raise ValueError(f"early exit k={k!r}: the checkpoint has layers 1..{total}")
    config = copy.deepcopy(model.config)
    text = config.get_text_config()  # the config itself for plain LMs
    for cfg in {id(config): config, id(text): text}.values():
        cfg.num_hidden_layers = k
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = list(cfg.layer_types)[:k]
    view_inner = copy.copy(inner)
    view_inner._modules = dict(inner._modules)
    view_inner._modules["layers"] = torch.nn.ModuleList(list(inner.layers)[:k])
    view_inner.config = config.get_text_config()
    if adapter is not None:
        head = model.get_output_embeddings().weight
        view_inner._modules["norm"] = AdaptedNorm(inner.norm, adapter, dtype=head.dtype,
                                                  device=head.device)
    view = copy.copy(model)
    view._modules = dict(model._modules)
    name = next(n for n, m in model._modules.items() if m is inner)
    view._modules[name] = view_inner
    view.config = config
    return view


class HFDrafter(LedgerCaches, HFRole, Drafter):
    """An incremental drafter over a causal LM (a checkpoint, or an early-exit view).
    ``_requests``: request -> (Ledger, its KV cache); open, commit, reset and close are
    LedgerCaches' (hf_requests.py), shared with the target."""

    # -- construction (from_checkpoint: HFRole) ------------------------------

    @classmethod
    def early_exit(cls, ckpt: Checkpoint, k: int,
                   adapter: ExitAdapter | None = None) -> HFDrafter:
        """First ``k`` layers of ``ckpt`` (+ the exit ``adapter``) + its final norm and
        LM head."""
        identity = exit_identity(ckpt, k, adapter)  # refuses a map that does not fit
        return cls(early_exit_view(ckpt.model, k, adapter), identity=identity,
                   tokenizer_digest=ckpt.tokenizer_digest, vocab=ckpt.vocab,
                   variant=ckpt.variant)

    @classmethod
    def load_early_exit(cls, path, k: int, adapter: ExitAdapter | None = None,
                        **load) -> HFDrafter:
        """Load a checkpoint for early exit only: layers past k are not kept alive."""
        return cls.early_exit(load_checkpoint(path, **load), k, adapter)

    # -- the seam ----------------------------------------------------------

    def append(self, request: RequestKey, token: int) -> None:
        ledger, _ = self._get(request)
        ledger.spec.append(int(token))

    def next_logits(self, request: RequestKey, token: int | None = None) -> torch.Tensor:
        ledger, cache = self._get(request)
        if token is not None:
            ledger.spec.append(int(token))
        start = ledger.feed_start(1)
        crop(cache, start)
        feed = ledger.tokens[start:]
        logits = self.lm.forward(torch.tensor([feed]), cache, last=1)[0, -1]
        ledger.cached = len(ledger.committed) + len(ledger.spec)
        return logits
