"""Counting, on the CPU, the reads a GPU would wait for (each a host sync there).

CI has no GPU, so how often the decision path stops to read a device flag back into
Python cannot be timed here; it can be counted. Inside ``HostReads`` (a torch
TorchFunctionMode) a tensor is a *device* tensor when it was made with an explicit
``device=`` (what code does for tensors meant for the decider's device), moved with
``.to(device)``, or computed from a device tensor; a tensor made from host data without
``device=`` (torch.tensor, from_numpy, as_tensor) is a host tensor, and ``.cpu()`` makes
one. ``reads`` counts every read of a device tensor back to Python or the host: bool / int
/ float / item / tolist / numpy, ``.cpu()`` (a copy the caller waits for), ``nonzero``
and indexing by a bool mask (both need the count of true entries first). (``.to`` a
device name is always a move *to* the device here: on a CPU-only machine every name is
"cpu", so ``.to("cpu")`` cannot be told apart and is not counted; code that reads back
to the host says ``.cpu()``.)
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_READS = {"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "numpy",
          "__array__", "nonzero", "cpu"}
_FACTORIES = {torch.tensor, torch.as_tensor, torch.from_numpy, torch.empty, torch.zeros,
              torch.ones, torch.full, torch.arange}


def _tensors(x, out: list) -> list:
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _tensors(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _tensors(y, out)
    return out


class HostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self._device: dict[int, torch.Tensor] = {}  # id -> tensor (kept: ids stay unique)

    def on_device(self, tensors) -> None:
        """Mark ``tensors`` (a tensor or nested lists of them) as device tensors: what a
        target's forward returns on a GPU."""
        for t in _tensors(tensors, []):
            self._device[id(t)] = t

    def _is_device(self, t: torch.Tensor) -> bool:
        return self._device.get(id(t)) is t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        inputs = _tensors(list(args), []) + _tensors(list(kwargs.values()), [])
        from_device = any(self._is_device(t) for t in inputs)
        if from_device and name in _READS:
            self.reads += 1
        if name == "__getitem__" and from_device and len(args) > 1 and any(
                t.dtype == torch.bool for t in _tensors([args[1]], [])):
            self.reads += 1
        out = func(*args, **kwargs)
        if name == "cpu":  # a host copy: on the CPU torch returns the tensor itself,
            # which would leave the copy marked as the device tensor it came from
            return out.clone() if from_device and out is args[0] else out
        moved = name == "to" and (any(isinstance(a, (str, torch.device)) for a in args[1:])
                                  or "device" in kwargs)
        made_there = func in _FACTORIES and kwargs.get("device") is not None
        if moved or made_there or (from_device and func not in _FACTORIES):
            self.on_device(out)
        return out
