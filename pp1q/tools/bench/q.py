"""Distribution core: build_row, sample and one verification round, as ratios to softmax.

Every operation runs on the same 129280-token row in the same run, interleaved
repetition by repetition (so machine noise hits all of them alike); the figure is the
median time and its ratio to one plain numpy FP64 softmax pass over that row
(max, subtract, exp, sum, divide), the floor any exact q construction starts from.
"""

from __future__ import annotations

import time

import numpy as np

TITLE = "Distribution core: build_row, sample, verify (one 129280-token row)"

VOCAB = 129280
DEPTH = 5  # the seed's production depth
BATCH = 4  # the seed's bound on requests per batch


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _cases(rng: np.random.Generator):
    from pp1q.core.q import build_row, sample
    from pp1q.core.rng import proposal_u24
    from pp1q.core.verify import RoundKeys, verify_batch, verify_round

    logits = rng.normal(size=VOCAB) * 4.0  # a peaked row: ~35k tokens keep a count
    dense = build_row(logits)
    sparse = build_row(logits, top_k=32)
    u24 = proposal_u24(1, 1, 1, 1)

    target = rng.normal(size=(BATCH, DEPTH + 1, VOCAB)) * 4.0
    p = np.exp(target - target.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    q_rows = [[build_row(-target[b, i], top_k=32) for i in range(DEPTH)] for b in range(BATCH)]
    drafts = [[sample(r, u24) for r in chain] for chain in q_rows]  # heavy rejection
    keys = [RoundKeys(seed=b + 1, generation=1, round_id=7, first_position=100)
            for b in range(BATCH)]

    torch_cases = []
    try:
        import torch

        t64 = torch.from_numpy(logits)
        t32 = t64.float()
        torch_cases = [
            ("torch softmax fp32 (peer reference)", lambda: torch.softmax(t32, 0)),
            ("torch softmax fp64", lambda: torch.softmax(t64, 0)),
        ]
    except ImportError:  # torch is a dependency, but the core must not need it here
        pass

    return [
        ("numpy softmax fp64 (baseline)", lambda: _softmax(logits)),
        *torch_cases,
        ("build_row dense", lambda: build_row(logits)),
        ("build_row temperature 0.8", lambda: build_row(logits, temperature=0.8)),
        ("build_row top_k 32", lambda: build_row(logits, top_k=32)),
        (f"sample dense row ({dense.support_size} ids)", lambda: sample(dense, u24)),
        ("sample top-32 row", lambda: sample(sparse, u24)),
        (f"verify_round depth {DEPTH}, 1 request", lambda: verify_round(p[0], q_rows[0],
                                                                     drafts[0], keys[0])),
        (f"verify_batch depth {DEPTH}, {BATCH} requests", lambda: verify_batch(p, q_rows,
                                                                            drafts, keys)),
    ]


def run(quick: bool) -> list[str]:
    rng = np.random.default_rng(0)
    cases = _cases(rng)
    reps = 15 if quick else 200
    for _, fn in cases:  # warm-up: imports, allocator, caches
        fn()
    times = {name: [] for name, _ in cases}
    for _ in range(reps):
        for name, fn in cases:
            t0 = time.perf_counter_ns()
            fn()
            times[name].append(time.perf_counter_ns() - t0)
    base = float(np.median(times[cases[0][0]]))
    lines = [f"{'operation':<44} {'median':>10} {'x softmax':>10}   ({reps} reps, interleaved)"]
    for name, _ in cases:
        med = float(np.median(times[name]))
        lines.append(f"{name:<44} {med / 1e6:>8.3f}ms {med / base:>10.2f}")
    return lines
