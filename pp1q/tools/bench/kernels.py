"""Kernels: residual sampling and count allocation as ratios to one torch softmax pass.

Rows: 4 requests x depth 5 = 20 rows of vocabulary 129280 (the seed's batch), on CUDA
where there is a GPU (Triton kernels where triton imports: scripts/device_check.sh runs
this suite there), else on the CPU torch path. Every case runs on the same rows
in the same run, interleaved repetition by repetition, and is reported per row and as
a ratio to one torch fp32 softmax pass over the same 20 rows (the pass every target
already makes to get p). Peer styles for residual sampling, same rows and q:
HF-style (clamp p - q, normalise, torch.multinomial) and vLLM-style (clamp p - q,
exponential race: argmax of r / Exp(1) noise), both given the top-32 q as a dense
float32 row. On a GPU two more lines answer whether a real target's rounds are better
decided where its p is (KernelRounds on the device: what EngineDecider does) or after
copying p to the host for the CPU path (what it did before 2 Dec 2026): the same four
rounds of float64 p either way (the drafts here are adversarial: each round rejects its
first draft and reads one row, so the copy moves six rows for every one read).
"""

from __future__ import annotations

import time

import numpy as np

from pp1q.tools.bench import bench_device, device_clock

TITLE = ("Kernels: residual sampling, count allocation (20 rows of 129280, torch; on CUDA "
         "where there is a GPU)")

VOCAB = 129280
DEPTH = 5  # the seed's production depth
BATCH = 4  # the seed's bound on requests per batch
TOP_K = 32  # the seed's initial sparse candidate
ROWS = BATCH * DEPTH


def _cases(dev: str):
    import torch

    from pp1q.core.verify import RoundKeys
    from pp1q_kernels import counts, dispatch, lazy_step, numba_rows, verify_step
    from pp1q_kernels.lookup import count_at, dense_counts, to_rows

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    t_logits = (torch.randn(BATCH, DEPTH + 1, VOCAB, generator=g) * 4.0).to(dev)
    p_all = torch.softmax(t_logits, -1)  # float32 target rows, as a GPU target holds them
    p = p_all[:, :DEPTH].reshape(ROWS, VOCAB).contiguous()
    logits = t_logits[:, :DEPTH].reshape(ROWS, VOCAB).contiguous()
    d_logits = -t_logits[:, :DEPTH].double()  # adversarial draft: heavy rejection
    q_sparse = counts.build_counts(d_logits.reshape(ROWS, VOCAB), top_k=TOP_K)
    q_dense = counts.build_counts(d_logits.reshape(ROWS, VOCAB))  # full-vocabulary draft rows
    q_float = dense_counts(q_sparse).float() / 2**24
    w = counts.softmax_weights(logits.double())
    u53 = torch.randint(0, 2**53, (ROWS,), generator=g).to(dev)
    round_keys = [RoundKeys(seed=b + 1, generation=1, round_id=7, first_position=100)
                  for b in range(BATCH)]
    keys = verify_step.StepKeys.from_keys(round_keys, device=dev)
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
    p_rows = list(p_all.cpu().numpy())
    k = numba_rows.chosen()[2]

    def lazy_torch():
        return lazy_step.decide_rows(list(p_all), c_x, lambda i: q_step.index(
            torch.arange(BATCH, device=dev), i.to(dev)), draft, *draws)

    def lazy_numba():
        return numba_rows.decide_rows(k, p_rows, c_x.cpu().numpy(), chains,
                                      draft.cpu().numpy(), *(d.cpu().numpy() for d in draws))

    service = []  # on a GPU: the service's decision where p is, against p copied over
    if dev != "cpu":
        from pp1q.verifier.kernel_rounds import KernelRounds

        p64 = list(p_all.double())  # EngineDecider's p: float64, on the target's device
        drafts = draft.tolist()
        on_device, on_host = KernelRounds(dev), KernelRounds("cpu")
        service = [
            ("decision on the device (KernelRounds)",
             lambda: on_device.sampled(p64, chains, drafts, round_keys)),
            ("decision after p copied to the host",
             lambda: on_host.sampled([p.cpu().numpy() for p in p64], chains, drafts,
                                     round_keys)),
        ]

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
        *service,
        # build_counts' first step and its floor: the FP64 softmax the design asks for
        ("torch softmax fp64 (same precision)", lambda: torch.softmax(logits64, -1)),
        ("counts: FP64 weights alone (softmax_weights)", lambda: counts.softmax_weights(logits)),
        ("counts: allocate (given FP64 weights)", lambda: dispatch.allocate(w)),
        ("counts: build_counts dense (from logits)", lambda: dispatch.build_counts(logits)),
        ("counts: build_counts top-32", lambda: dispatch.build_counts(logits, top_k=TOP_K)),
    ]


def _medians(cases, reps: int, sync) -> list[float]:
    """Median ns per case; cases interleaved in every repetition so noise hits all alike;
    ``sync`` waits for the device before each clock read (a GPU runs behind its caller)."""
    for _, fn in cases:  # warm-up: imports, allocator, caches, kernel compiles
        fn()
    samples = [[0] * reps for _ in cases]
    for r in range(reps):
        for i, (_, fn) in enumerate(cases):
            sync()
            t0 = time.perf_counter_ns()
            fn()
            sync()
            samples[i][r] = time.perf_counter_ns() - t0
    return [float(np.median(s)) for s in samples]


def run(quick: bool) -> list[str]:
    import torch

    dev = bench_device()
    cases = _cases(dev)
    reps = 5 if quick else 30
    medians = _medians(cases, reps, device_clock(dev))
    where = (f"on {torch.cuda.get_device_name()}" if dev != "cpu"
             else f"on the CPU, {torch.get_num_threads()} threads")
    lines = [f"torch {torch.__version__} {where}, {ROWS} rows of {VOCAB}; per row = median "
             f"/ {ROWS}",
             f"{'operation':<44} {'per row':>10} {'x softmax':>10}   ({reps} reps, interleaved)"]
    for (name, _), med in zip(cases, medians, strict=True):
        lines.append(f"{name:<44} {med / ROWS / 1e3:>8.1f}us {med / medians[0]:>10.2f}")
    return lines
