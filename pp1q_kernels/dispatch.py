"""Backend choice for the hot kernels: Triton on CUDA tensors, torch everywhere else
(count allocation on the CPU: build_row's numba kernel where it runs, see ``allocate``).

Both backends return bit-identical results (exact integer arithmetic; tests compare
them under TRITON_INTERPRET=1), so the choice is about speed only. Override with the
environment variable PP1Q_KERNEL_BACKEND = auto | torch | triton, or ``backend=``.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from pp1q.core import q_backend
from pp1q.core.errors import LocalProtocolError, Reason

from . import counts, residual
from . import verify_step as torch_verify

BACKEND_ENV = "PP1Q_KERNEL_BACKEND"
BACKENDS = ("auto", "torch", "triton")


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def backend_for(t: torch.Tensor, backend: str | None = None) -> str:
    """'triton' or 'torch' for tensors on t's device."""
    choice = _requested(backend)
    if choice not in BACKENDS:
        raise LocalProtocolError(Reason.UNSUPPORTED_FEATURE, f"kernel backend {choice!r}")
    if choice == "auto":
        return "triton" if t.is_cuda and triton_available() else "torch"
    if choice == "triton" and not triton_available():
        raise LocalProtocolError(Reason.UNSUPPORTED_FEATURE, "triton is not installed")
    return choice


def _requested(backend: str | None) -> str:
    """The backend asked for: ``backend=``, else PP1Q_KERNEL_BACKEND, else auto."""
    return backend or os.environ.get(BACKEND_ENV, "auto")


def residual_sample(p, q, u53, *, use_q=None, validate=True, backend=None):
    """(ids, underflow) per row: residual.residual_sample on the chosen backend."""
    if backend_for(p, backend) == "triton":
        from .triton_residual import residual_sample as run
    else:
        run = residual.residual_sample
    return run(p, q, u53, use_q=use_q, validate=validate)


def allocate(w, *, backend=None):
    """Counts of normalised FP64 weight rows: counts.allocate on the chosen backend. On
    the CPU under ``auto``, where pp1q.core.q_backend's choice is numba, build_row's own
    kernel a row at a time (counts.allocate_rows: the same integers, several times
    faster); ``backend="torch"`` (or PP1Q_KERNEL_BACKEND=torch) keeps torch's."""
    return _allocator(w, backend)(w)


def build_counts(logits, temperature=1.0, top_k=None, *, backend=None):
    """q rows from logits (dense counts, or SparseCounts with top_k)."""
    # the weights build_counts hands its allocator are its own temporary: consumed
    return counts.build_counts(logits, temperature, top_k,
                               allocator=lambda w: _allocator(w, backend, consume=True)(w))


def _allocator(w, backend, consume: bool = False):
    if backend_for(w, backend) == "triton":
        from .triton_counts import allocate as run
        return run
    auto_on_cpu = _requested(backend) == "auto" and w.device.type == "cpu"
    k = q_backend.kernels() if auto_on_cpu else None  # numba loads only when it may run
    if k is not None:
        return lambda x: counts.allocate_rows(k, x, consume)
    return counts.allocate


def verify(p, q, draft, keys, *, validate=True, backend=None):
    """The batched verification step on the chosen backend (a StepResult)."""
    if backend_for(p, backend) == "triton":
        from .triton_verify import verify_step as run
    else:
        run = torch_verify.verify_step
    return run(p, q, draft, keys, validate=validate)
