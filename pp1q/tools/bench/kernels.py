"""Kernels: residual sampling and count allocation as ratios to one torch softmax pass.

Rows: 4 requests x depth 5 = 20 rows of vocabulary 129280 (the seed's batch), on the
CPU torch path (Triton runs only on a GPU; none here). Every case runs on the same rows
in the same run, interleaved repetition by repetition, and is reported per row and as
a ratio to one torch fp32 softmax pass over the same 20 rows (the pass every target
already makes to get p). Peer styles for residual sampling, same rows and q:
HF-style (clamp p - q, normalise, torch.multinomial) and vLLM-style (clamp p - q,
exponential race: argmax of r / Exp(1) noise), both given the top-32 q as a dense
float32 row.
"""

from __future__ import annotations

import time

import numpy as np

TITLE = "Kernels: residual sampling, count allocation (20 rows of 129280, torch CPU)"

VOCAB = 129280
DEPTH = 5  # the seed's production depth
BATCH = 4  # the seed's bound on requests per batch
TOP_K = 32  # the seed's initial sparse candidate
ROWS = BATCH * DEPTH


def _cases():
    import torch
    from pp1q_kernels import counts, dispatch, lazy_step, numba_rows, verify_step
    from pp1q_kernels.lookup import count_at, dense_counts, to_rows

    from pp1q.core.verify import RoundKeys

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    t_logits = torch.randn(BATCH, DEPTH + 1, VOCAB, generator=g) * 4.0
    p_all = torch.softmax(t_logits, -1)  # float32 target rows, as a GPU target holds them
    p = p_all[:, :DEPTH].reshape(ROWS, VOCAB).contiguous()
    logits = t_logits[:, :DEPTH].reshape(ROWS, VOCAB).contiguous()
    d_logits = -t_logits[:, :DEPTH].double()  # adversarial draft: heavy rejection
    q_sparse = counts.build_counts(d_logits.reshape(ROWS, VOCAB), top_k=TOP_K)
    q_dense = counts.build_counts(d_logits.reshape(ROWS, VOCAB))  # full-vocabulary draft rows
    q_float = dense_counts(q_sparse).float() / 2**24
    w = counts.softmax_weights(logits.double())
    u53 = torch.randint(0, 2**53, (ROWS,), generator=g)
    keys = verify_step.StepKeys.from_keys(
        [RoundKeys(seed=b + 1, generation=1, round_id=7, first_position=100) for b in range(BATCH)])
    q_step = q_sparse.reshape(BATCH, DEPTH)
    draft = torch.stack([q_step.ids[b, :, 0] for b in range(BATCH)])  # in-support drafts

    def hf_style():
        r = (p - q_float).clamp_(min=0)
        return torch.multinomial(r / r.sum(-1, keepdim=True), 1)

    def vllm_style():
        r = (p - q_float).clamp_(min=0)
        return (r / torch.empty_like(r).exponential_()).argmax(-1)

    def residual(q, validate=False):
        return lambda: dispatch.residual_sample(p, q, u53, validate=validate)

    # the lazy step (rows read only as a round reaches them), torch and numba, same draws
    draws = verify_step.step_draws(keys, DEPTH)
    c_x = count_at(q_step, draft)
    chains = [to_rows(q_step.index(b)) for b in range(BATCH)]
    p_rows = list(p_all.numpy())
    k = numba_rows.chosen()[2]

    def lazy_torch():
        return lazy_step.decide_rows(list(p_all), c_x, lambda i: q_step.index(
            torch.arange(BATCH), i), draft, *draws)

    def lazy_numba():
        return numba_rows.decide_rows(k, p_rows, c_x.numpy(), chains, draft.numpy(),
                                      *(d.numpy() for d in draws))

    logits64 = logits.to(torch.float64)
    return [
        ("torch softmax fp32 (baseline)", lambda: torch.softmax(logits, -1)),
        ("residual, sparse q top-32", residual(q_sparse)),
        ("residual, sparse q, with p validation", residual(q_sparse, True)),
        ("residual, dense q (full-vocabulary draft)", residual(q_dense)),
        ("target pick (bonus / target-only)", residual(None)),
        ("HF-style: clamp, normalise, multinomial", hf_style),
        ("vLLM-style: clamp, exponential race", vllm_style),
        ("verify step (4 req x depth 5, sparse q)",
         lambda: dispatch.verify(p_all, q_step, draft, keys, validate=False)),
        ("lazy step, torch (CPU without numba)", lazy_torch),
        *([("lazy step, numba (the service's CPU path)", lazy_numba)] if k else []),
        # build_counts' first step and its floor: the FP64 softmax the design asks for
        ("torch softmax fp64 (same precision)", lambda: torch.softmax(logits64, -1)),
        ("counts: FP64 weights alone (softmax_weights)", lambda: counts.softmax_weights(logits)),
        ("counts: allocate (given FP64 weights)", lambda: dispatch.allocate(w)),
        ("counts: build_counts dense (from logits)", lambda: dispatch.build_counts(logits)),
        ("counts: build_counts top-32", lambda: dispatch.build_counts(logits, top_k=TOP_K)),
    ]


def _medians(cases, reps: int) -> list[float]:
    """Median ns per case; cases interleaved in every repetition so noise hits all alike."""
    for _, fn in cases:  # warm-up: imports, allocator, caches
        fn()
    samples = [[0] * reps for _ in cases]
    for r in range(reps):
        for i, (_, fn) in enumerate(cases):
            t0 = time.perf_counter_ns()
            fn()
            samples[i][r] = time.perf_counter_ns() - t0
    return [float(np.median(s)) for s in samples]


def run(quick: bool) -> list[str]:
    import torch

    cases = _cases()
    reps = 5 if quick else 30
    medians = _medians(cases, reps)
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads, {ROWS} rows of "
             f"{VOCAB}; per row = median / {ROWS}",
             f"{'operation':<44} {'per row':>10} {'x softmax':>10}   ({reps} reps, interleaved)"]
    for (name, _), med in zip(cases, medians, strict=True):
        lines.append(f"{name:<44} {med / ROWS / 1e3:>8.1f}us {med / medians[0]:>10.2f}")
    return lines
