"""Hugging Face checkpoints: local loading, identities, and the KV-cache shims.

Optional: transformers (and gguf, accelerate) come with ``pip install 'pp1q[hf]'``.
Nothing here imports transformers at module import time, so ``import pp1q.models``
works on the lean core install; ``load_checkpoint`` says what to install.

A checkpoint is a local path, never a hub id: a folder with config.json and
safetensors weights, or one ``.gguf`` file (transformers de-quantizes GGUF weights to
the requested dtype at load; the tokenizer comes from the same file). Every
from_pretrained call passes local_files_only=True, so nothing is fetched at run time.

Identity for HELLO: the sha256 of the weight files (and config.json) as stored,
so two hosts agree exactly when they hold the same bytes; the tokenizer digest is the
sha256 of the id -> token list, so a GGUF and a folder exported from it agree.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.models.hf_cache import kv_tensors, make_growing
from pp1q.runtime.files import check_regular, open_regular

HF_INSTALL_HINT = "pip install 'pp1q[hf]'  (transformers, gguf, accelerate)"
_DTYPES = {"float32": torch.float32, "fp32": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
_WEIGHT_SUFFIXES = (".safetensors", ".gguf")
_CHUNK = 1 << 22
EXPORT_MARKER = "pp1q-export.json"  # names the checkpoint an exported folder came from


def require_transformers():
    """The transformers module, or an ImportError naming the extra to install."""
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(f"real models need transformers: {HF_INSTALL_HINT}") from exc
    return transformers


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dtype {dtype}: use float32 or bfloat16")
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"dtype {dtype!r}: use float32 or bfloat16") from None


def checkpoint_files(path: Path) -> list[Path]:
    """The files whose bytes define the model: the .gguf, or config.json + weights.

    A folder's other entries (the tokenizer's files, generation_config.json, ...) are
    opened by transformers, not by us: each must be a regular file or a folder, or the
    folder is refused here by the entry's name (NotRegularFileError), before transformers
    opens a FIFO with no writer and waits for ever."""
    if path.is_file():
        return [path]
    entries = sorted(path.iterdir())
    files = [p for p in entries if p.suffix in _WEIGHT_SUFFIXES]
    if not files:
        raise FileNotFoundError(f"{path}: no .safetensors or .gguf weights in this folder")
    config = path / "config.json"
    for other in entries:
        if other.suffix not in _WEIGHT_SUFFIXES and other != config:
            with contextlib.suppress(FileNotFoundError):  # a dangling link: not ours to read
                check_regular(other, folder_ok=True)
    # exists, not is_file: a FIFO or folder there is refused by files_digest, not skipped
    # for transformers to open (a FIFO with no writer: for ever)
    return ([config] if config.exists() else []) + files


def files_digest(files: list[Path]) -> str:
    """sha256 over (name, size, bytes) of each file, in order. About 1 s per GB. A FIFO,
    device or folder among them is refused (NotRegularFileError) before a byte is read."""
    h = hashlib.sha256()
    for f in files:
        with open_regular(f) as fh:
            h.update(f"{f.name}\0{os.fstat(fh.fileno()).st_size}\0".encode())
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()


def tokenizer_digest(tokenizer) -> str:
    """sha256 of the id -> token string list (ids 0..len-1, added tokens included)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return "sha256:" + hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:32]


def logits_width(model) -> int:
    """Width of the LM head's output (the config's vocab_size may differ from it)."""
    head = model.get_output_embeddings()
    return int(head.weight.shape[0]) if head is not None else int(
        model.config.get_text_config().vocab_size)


@dataclass
class Checkpoint:
    """A loaded model and what names it. ``model`` is in eval mode, gradients off."""

    model: Any  # a transformers PreTrainedModel (causal LM)
    tokenizer: Any
    identity: str
    tokenizer_digest: str
    vocab: int
    path: Path
    load_seconds: float

    @property
    def max_positions(self) -> int | None:
        """The positions the model was built for (config's max_position_embeddings; None
        when the config names none): the longest context a request may reach."""
        n = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        return n if isinstance(n, int) and n > 0 else None

    @property
    def variant(self) -> str:
        return f"dtype={str(self.model.dtype).removeprefix('torch.')}:device={self.model.device}"


def load_checkpoint(path: str | Path, *, device: str | torch.device = "cpu",
                    dtype: str | torch.dtype = "float32",
                    gguf_cache: str | Path | None = None) -> Checkpoint:
    """Load a local causal LM checkpoint (folder or .gguf file) on ``device``.

    ``gguf_cache``: a folder where a GGUF checkpoint is kept de-quantized (float32
    safetensors, one subfolder per GGUF digest, see ``gguf_cache_entry``). The first
    load parses the GGUF and writes the entry; later loads read the entry (about 1 s
    instead of about 20 s for the 135M model on 2 cores). The identity stays the
    GGUF's own, so hosts with and without a cache agree at HELLO.
    """
    require_transformers()
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such checkpoint (a folder or a .gguf file)")
    t0 = time.perf_counter()
    digest = files_digest(checkpoint_files(path))
    identity = _identity(path, digest)
    if path.is_file() and gguf_cache is not None:
        entry = gguf_cache_entry(path, gguf_cache, digest)
        # de-quantize once at float32 (whatever dtype is asked for now), then write
        export_once(entry, lambda tmp: export_folder(_load(path, "cpu", "float32", identity),
                                                     tmp))
        path_to_load = entry
    else:
        path_to_load = path
    ckpt = _load(path_to_load, device, dtype, identity)
    ckpt.path = path
    ckpt.load_seconds = time.perf_counter() - t0
    return ckpt


def export_once(entry: Path, export: Callable[[Path], object]) -> None:
    """Make the cache folder ``entry`` with ``export(tmp)`` (which writes a whole export,
    EXPORT_MARKER included, into the new folder ``tmp``) unless it exists already.
    Processes asking at once export once: an exclusive lock beside the entry keeps the
    others waiting (a daemon pair's first start, or parallel test workers: two
    de-quantizations at once took twice as long on two cores), and they then find the
    entry. An entry only ever appears whole, by rename, so a process killed mid-export
    leaves at most a stray temporary folder; where no lock exists (fcntl is POSIX)
    processes may export side by side and the first rename wins."""
    if (entry / EXPORT_MARKER).is_file():  # no lock to find it: a read-only cache serves
        return
    entry.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(entry.with_name(f"{entry.name}.lock")):
        if (entry / EXPORT_MARKER).is_file():
            return
        tmp = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
        export(tmp)
        with contextlib.suppress(OSError):  # another process may have won the race
            os.replace(tmp, entry)
        shutil.rmtree(tmp, ignore_errors=True)
    if not (entry / EXPORT_MARKER).is_file():  # entries only appear by rename
        raise FileExistsError(f"{entry}: not a pp1q export; remove it")


@contextlib.contextmanager
def _exclusive(lock_path: Path):
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the rename alone keeps entries whole
        yield
        return
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes (or the process dies)
        yield


MAX_STEM_CHARS = 40  # with the early exit and adapter tags, an identity fits HELLO's 128


def _identity(path: Path, digest: str) -> str:
    return f"hf:{path.stem[:MAX_STEM_CHARS]}:sha256={digest[:32]}"


def checkpoint_identity(path: str | Path) -> str:
    """The identity ``load_checkpoint(path)`` gives, without loading (bytes digest only)."""
    path = Path(path).expanduser()
    return _identity(path, files_digest(checkpoint_files(path)))


def _load(path: Path, device, dtype, identity: str) -> Checkpoint:
    transformers = require_transformers()
    t0 = time.perf_counter()
    where, extra = (path.parent, {"gguf_file": path.name}) if path.is_file() else (path, {})
    common = dict(local_files_only=True, trust_remote_code=False, **extra)
    tokenizer = transformers.AutoTokenizer.from_pretrained(where, **common)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        where, dtype=resolve_dtype(dtype), **common)
    model.to(device)
    if model.device.type == "cpu" and model.config._attn_implementation == "sdpa":
        from pp1q.models.hf_attention import register  # a chunk's attention, unmasked

        with contextlib.suppress(ValueError):  # a model refusing it keeps sdpa
            model.set_attn_implementation(register())
    model.eval()
    model.requires_grad_(False)
    return Checkpoint(model=model, tokenizer=tokenizer, identity=identity,
                      tokenizer_digest=tokenizer_digest(tokenizer), vocab=logits_width(model),
                      path=path, load_seconds=time.perf_counter() - t0)


def gguf_cache_entry(gguf: Path, root: str | Path, digest: str | None = None) -> Path:
    """Where ``load_checkpoint(gguf, gguf_cache=root)`` keeps the de-quantized copy."""
    digest = digest or files_digest(checkpoint_files(Path(gguf)))
    return Path(root).expanduser() / f"{Path(gguf).stem}-sha256-{digest[:32]}"


# ---------------------------------------------------------------------------
# forward passes and KV caches, across transformers versions


class HFRole:
    """What the drafter and the target both keep of one causal LM: its forward
    (CausalLM), the identity and tokenizer digest HELLO names, the vocabulary, and the
    table of open requests (each role stores its own per-request state in it)."""

    def __init__(self, model, *, identity: str, tokenizer_digest: str, vocab: int,
                 variant: str = "") -> None:
        self.lm = CausalLM(model)
        self.device = self.lm.device  # Engine.device: where its logits are
        self.identity = identity
        self.tokenizer_digest = tokenizer_digest
        self.vocab = int(vocab)
        self.variant = variant
        self._requests: dict = {}

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint):
        """The whole checkpoint in this role (a drafter: pair it with ``check_pair``)."""
        return cls(ckpt.model, identity=ckpt.identity, tokenizer_digest=ckpt.tokenizer_digest,
                   vocab=ckpt.vocab, variant=ckpt.variant)


class CausalLM:
    """One model's forward with a DynamicCache, whatever the cache keyword is called.

    transformers 5.x renamed ``past_key_values`` to ``cache``; the keyword is read off
    the forward signature once. Only full-attention layers are supported: sliding
    window layers crop differently and would silently break rollback.
    """

    def __init__(self, model) -> None:
        self.model = model
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = "logits_to_keep" if "logits_to_keep" in params else None
        self.device = model.device
        transformers = require_transformers()
        self._cache_cls = transformers.DynamicCache

    def new_cache(self):
        """A DynamicCache whose layers append in place (pp1q.models.hf_cache)."""
        try:
            cache = self._cache_cls(config=self.model.config)
        except TypeError:  # older DynamicCache without config
            cache = self._cache_cls()
        if any(getattr(layer, "is_sliding", False) for layer in getattr(cache, "layers", ())):
            raise LocalProtocolError(Reason.UNSUPPORTED_FEATURE,
                                     "sliding-window attention layers are not supported")
        return make_growing(cache)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache, *, attention_mask=None, position_ids=None,
                last: int | None = None) -> torch.Tensor:
        """Logits [B, T or last, V] for ``ids`` [B, T]; extends ``cache``.

        float32 (bfloat16 logits are widened, exactly), float64 for a float64 model.
        """
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        if last is not None and self._keep_kw:
            kwargs[self._keep_kw] = last  # the LM head only for the rows we return
        logits = self.model(input_ids=ids.to(self.device), **kwargs).logits
        if last is not None:
            logits = logits[:, -last:]
        return logits if logits.dtype == torch.float64 else logits.float()

    @torch.inference_mode()
    def hidden(self, ids: torch.Tensor, cache, last: int | None = None, *,
               attention_mask=None, position_ids=None) -> torch.Tensor:
        """The last ``last`` (None: all) hidden states [B, last, H] of a decoder (the
        model under an LM head: ``get_decoder()``) for ``ids`` [B, T]; extends ``cache``.
        What the head of a vocabulary shard multiplies (pp1q.models.hf_shard)."""
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        out = self.model(input_ids=ids.to(self.device), **kwargs).last_hidden_state
        return out if last is None else out[:, -last:]


def cache_from(lm: CausalLM, kv) -> object:
    """A new DynamicCache holding ``kv`` (per layer (keys, values); [] for none)."""
    cache = lm.new_cache()
    for i, (k, v) in enumerate(kv):
        cache.update(k, v, i)
    return cache


def forward_stacked(lm: CausalLM, run, items) -> list:
    """One forward for several requests: ``items`` (kv, start, feed, rows) per request,
    its cached K/V of ``start`` tokens, the tokens to feed and how many last positions
    it wants; ``run(ids, cache, mask, positions)`` is the model call ([B, T, X] out).
    Caches are left-padded to the longest, feeds right-padded, an attention mask hides
    both and each request keeps its own positions (padding never shifts RoPE). Returns
    per request (its last ``rows`` outputs, its grown K/V). Used by HFTarget's batched
    rounds and a vocabulary shard's (pp1q.models.hf_shard)."""
    dev = lm.device
    width = max(start for _, start, _, _ in items)  # longest cache: the rest left-padded
    steps = max(len(feed) for _, _, feed, _ in items)  # longest feed: the rest right-padded
    ids = torch.zeros(len(items), steps, dtype=torch.long)
    mask = torch.zeros(len(items), width + steps, dtype=torch.long)
    pos = torch.zeros(len(items), steps, dtype=torch.long)
    for b, (_, start, feed, _) in enumerate(items):
        ids[b, : len(feed)] = torch.tensor(feed)
        mask[b, width - start: width + len(feed)] = 1
        pos[b] = start + torch.arange(steps)  # each request's own positions
    cache = lm.new_cache()
    if width:
        ref = next(kv for kv, _, _, _ in items if kv)
        for i, (rk, _) in enumerate(ref):
            empty = rk.new_zeros((1, rk.shape[1], 0, rk.shape[3]))
            ks = [torch.nn.functional.pad(kv[i][0] if kv else empty, (0, 0, width - start, 0))
                  for kv, start, _, _ in items]
            vs = [torch.nn.functional.pad(kv[i][1] if kv else empty, (0, 0, width - start, 0))
                  for kv, start, _, _ in items]
            cache.update(torch.cat(ks), torch.cat(vs), i)
    out = run(ids, cache, mask.to(dev), pos.to(dev))
    grown = kv_tensors(cache)
    result = []
    for b, (_, start, feed, rows) in enumerate(items):
        lo, hi = width - start, width + len(feed)  # this request's real positions
        result.append((out[b, len(feed) - rows: len(feed)],
                       [(k[b: b + 1, :, lo:hi], v[b: b + 1, :, lo:hi]) for k, v in grown]))
    return result


def export_folder(ckpt: Checkpoint, folder: str | Path) -> Path:
    """Write ``ckpt`` as a safetensors folder (config, weights, tokenizer).

    For a GGUF checkpoint this is the de-quantized model: loading the folder takes a
    fraction of a second where parsing the GGUF takes about 20 s on a 2-core CPU, and
    gives the same logits and the same tokenizer digest (its identity is the folder's
    own bytes). save_pretrained refuses GGUF-loaded models, so the state dict is
    written directly; tied weights (LM head = embeddings) are stored once.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = ckpt.model
    tied = {k for k in model.state_dict() if k == "lm_head.weight"} if getattr(
        model.config.get_text_config(), "tie_word_embeddings", False) else set()
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()
             if k not in tied}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    ckpt.tokenizer.save_pretrained(folder)
    # written last: a folder without it is an interrupted export, never loaded from cache
    (folder / EXPORT_MARKER).write_text(json.dumps(
        {"source": ckpt.identity, "tokenizer_digest": ckpt.tokenizer_digest}) + "\n")
    return folder
