"""Tensor kernels for proposal and verification (installed as ``pp1q_kernels``).

Tensor functions only: no wire, no asyncio, no daemons. Batched torch on any device;
the hot kernels (residual sampling, the verification step, count allocation) also in
Triton, chosen automatically for CUDA tensors (``dispatch``). See docs/kernels.md.

Kernels, in the seed's dependency order:
1. ``softmax_weights`` / ``logsumexp`` / ``build_counts`` / ``allocate``  (counts.py)
2. ``topk_support``, ``local_topk``, ``merge_topk``                     (topk.py)
3. ``sample_counts``, ``propose``                                        (proposal.py)
4. ``count_at``, ``dense_counts``, ``SparseCounts``                      (lookup.py)
5. ``residual_sample``, ``target_sample``                                (residual.py)
6. ``verify``, ``StepKeys``, ``StepResult``                              (verify_step.py)
Sharded forms: shard_emulator.py (``run_sharded``).
"""

from .counts import logsumexp, softmax_weights
from .dispatch import allocate, backend_for, build_counts, residual_sample, verify
from .lookup import SparseCounts, count_at, dense_counts, from_rows, to_rows
from .proposal import propose, sample_counts
from .residual import target_sample
from .topk import local_topk, merge_topk, topk_support
from .verify_step import StepKeys, StepResult

__all__ = [
    "SparseCounts", "StepKeys", "StepResult", "allocate", "backend_for", "build_counts",
    "count_at", "dense_counts", "from_rows", "local_topk", "logsumexp", "merge_topk",
    "propose", "residual_sample", "sample_counts", "softmax_weights", "target_sample",
    "to_rows", "topk_support", "verify",
]
