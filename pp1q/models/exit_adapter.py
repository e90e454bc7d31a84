"""A trained affine map on an early exit: layer-k hidden states -> the final layer's.

Plain early exit (hf_drafter.early_exit_view) reads the LM head off layer k's residual
stream as if it were the last layer's, so shallow exits draft poorly (BENCHMARKS.md,
Real model). An exit adapter is the tuned lens of Belrose et al. 2023 (also Kangaroo's
idea, Liu et al. 2024, with an affine map instead of a block): one affine map
h_k -> W h_k + b fitted so that the checkpoint's own final norm and LM head, applied
to it, give the last layer's distribution. The drafter runs layers 1..k, the map, the
final norm, the LM head; the target is untouched, and q is still exactly build_row of
the logits the drafter computed, so exactness does not depend on the map at all: a
better map only raises acceptance.

An adapter file is safetensors: ``weight`` [H, H] (out x in, as torch.nn.Linear),
``bias`` [H], float32, and metadata naming what it was fitted for (``source``: the
checkpoint identity, ``k``, ``layers``) and how (``training``: JSON, see
pp1q.tools.train_adapter). A file is refused unless it was fitted for the checkpoint
and the exit it is loaded with. Its identity is the sha256 of its content (the
metadata as sorted JSON, then the tensors' bytes), not of the file: safetensors writes
the metadata keys in a different order in each process, so two runs of the script
that fit the same map write different bytes; the content digest is the same, and two
hosts agree at HELLO exactly when they hold the same map.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pp1q.core.errors import ConfigError
from pp1q.runtime.files import NotRegularFileError, check_output, check_regular

ADAPTER_FORMAT = "pp1q-exit-adapter/1"
MAX_ADAPTER_BYTES = 80 << 20  # an fp32 affine map of hidden size 4096 is 64 MiB + header
ADAPTER_ID_HEX = 12  # digest characters in the drafter identity (HELLO ids <= 128 chars)
SHIPPED = Path(__file__).with_name("adapters")  # maps fitted by the repository's script


@dataclass(frozen=True)
class ExitAdapter:
    """An affine map for exit ``k`` of the checkpoint named ``source``."""

    weight: torch.Tensor  # [H, H]
    bias: torch.Tensor  # [H]
    source: str  # checkpoint identity it was fitted on
    k: int
    layers: int
    training: dict = field(default_factory=dict)  # how it was fitted (informational)
    digest: str = ""  # content_digest of the file it came from ("" before it is saved)

    @property
    def hidden(self) -> int:
        return int(self.weight.shape[0])

    @property
    def tag(self) -> str:
        """What the drafter identity appends: ``adapter=<first hex of the digest>``."""
        return f"adapter={self.digest[:ADAPTER_ID_HEX]}"

    def save(self, path: str | Path) -> ExitAdapter:
        """Write the file; returns the adapter with the file's digest. A FIFO, folder or
        device at ``path`` is refused by name (NotRegularFileError)."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # safetensors 0.4.5's save_file blocked for ever opening a FIFO with no reader
        # (0.8.0 replaces whatever is there by rename): refused by name, either way
        check_output(path)
        meta = {"format": ADAPTER_FORMAT, "source": self.source, "k": str(self.k),
                "layers": str(self.layers), "training": json.dumps(self.training, sort_keys=True)}
        save_file({"weight": self.weight.float().contiguous(),
                   "bias": self.bias.float().contiguous()}, str(path), metadata=meta)
        return load_adapter(path)


def content_digest(weight: torch.Tensor, bias: torch.Tensor, meta: dict) -> str:
    """sha256 of the sorted metadata JSON, then weight and bias as float32 bytes."""
    h = hashlib.sha256(json.dumps(meta, sort_keys=True).encode())
    for t in (weight, bias):
        h.update(t.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def load_adapter(path: str | Path) -> ExitAdapter:
    """Read and check an adapter file (size first, then format, shapes, finiteness)."""
    from safetensors import safe_open

    path = Path(path).expanduser()
    try:  # safetensors opens it by name: a FIFO with no writer would block that for ever
        check_regular(path)
    except NotRegularFileError as e:
        raise ConfigError(f"draft_adapter = {str(path)!r}: {e.strerror}",
                          key="draft_adapter") from None
    except OSError:
        raise ConfigError(f"draft_adapter = {str(path)!r}: no such file",
                          key="draft_adapter") from None
    size = path.stat().st_size
    if size > MAX_ADAPTER_BYTES:
        raise ConfigError(f"draft_adapter {path.name}: {size} bytes, more than "
                          f"{MAX_ADAPTER_BYTES} (an affine map is H*(H+1) floats)",
                          key="draft_adapter")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    except Exception as exc:  # safetensors raises its own error types
        raise ConfigError(f"draft_adapter {path.name}: not a safetensors file ({exc})",
                          key="draft_adapter") from None
    if meta.get("format") != ADAPTER_FORMAT or set(tensors) != {"weight", "bias"}:
        raise ConfigError(f"draft_adapter {path.name}: not a {ADAPTER_FORMAT} file",
                          key="draft_adapter")
    weight, bias = tensors["weight"], tensors["bias"]
    h = weight.shape[0] if weight.dim() == 2 else -1
    if weight.shape != (h, h) or bias.shape != (h,) or weight.dtype != torch.float32 \
            or bias.dtype != torch.float32:
        raise ConfigError(f"draft_adapter {path.name}: weight must be float32 [H, H] and "
                          f"bias [H]", key="draft_adapter")
    if not (torch.isfinite(weight).all() and torch.isfinite(bias).all()):
        raise ConfigError(f"draft_adapter {path.name}: non-finite values", key="draft_adapter")
    try:
        k, layers = int(meta["k"]), int(meta["layers"])
        training = json.loads(meta.get("training", "{}"))
    except (KeyError, ValueError):
        raise ConfigError(f"draft_adapter {path.name}: bad metadata", key="draft_adapter") \
            from None
    return ExitAdapter(weight, bias, meta.get("source", ""), k, layers, training,
                       content_digest(weight, bias, meta))


def shipped_adapter(identity: str, k: int) -> Path | None:
    """The repository's adapter for exit ``k`` of the checkpoint ``identity``, if any."""
    for path in sorted(SHIPPED.glob("*.safetensors")):
        meta = _metadata(path)
        if meta.get("source") == identity and meta.get("k") == str(k):
            return path
    return None


def _metadata(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata() or {}


def check_fits(adapter: ExitAdapter, identity: str, k: int, hidden: int) -> None:
    """Refuse a map fitted for another checkpoint, another exit or another width."""
    if adapter.source != identity:
        raise ConfigError(f"draft_adapter was fitted on {adapter.source!r}, not on "
                          f"{identity!r}", key="draft_adapter")
    if adapter.k != k:
        raise ConfigError(f"draft_adapter was fitted for early-exit:{adapter.k}, not "
                          f"early-exit:{k}", key="draft_adapter")
    if adapter.hidden != hidden:
        raise ConfigError(f"draft_adapter maps width {adapter.hidden}; the model's hidden "
                          f"size is {hidden}", key="draft_adapter")


class AdaptedNorm(torch.nn.Module):
    """The decoder's final norm, with the exit adapter in front: norm(W h + b)."""

    def __init__(self, norm: torch.nn.Module, adapter: ExitAdapter, *, dtype, device) -> None:
        super().__init__()
        self.norm = norm
        self.map = torch.nn.Linear(adapter.hidden, adapter.hidden, dtype=dtype, device=device)
        with torch.no_grad():
            self.map.weight.copy_(adapter.weight)
            self.map.bias.copy_(adapter.bias)
        self.requires_grad_(False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(self.map(hidden))
