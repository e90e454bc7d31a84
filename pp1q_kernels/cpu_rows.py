"""One gate for the CPU helpers of count allocation (the exact total's limbs in counts,
the top-k positions in topk): numba's pass where build_row's kernels run, torch's
form everywhere else. Both helpers take the same rows, so they share the gate."""

from __future__ import annotations

import torch

from pp1q.core import q_backend


def numba_rows(x: torch.Tensor):
    """(the numba_counts module, x's rows [-1, V] as one C-contiguous float64 array) where
    pp1q.core.q_backend chose numba and ``x`` is a float64 tensor on the CPU; else None."""
    if x.device.type != "cpu" or x.dtype != torch.float64 or q_backend.kernels() is None:
        return None
    from . import numba_counts  # numba is importable: q_backend chose it

    return numba_counts, x.detach().reshape(-1, x.shape[-1]).contiguous().numpy()
