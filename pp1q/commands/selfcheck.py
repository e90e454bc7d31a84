"""``pp1q selfcheck``: build q rows at full vocabulary, sample them, check the wire forms."""

from __future__ import annotations

import time

import numpy as np

HELP = "build dyadic24 q rows, sample them with keyed draws and check the round trips"


def add_arguments(p) -> None:
    p.add_argument("--vocab", type=int, default=129280, help="vocabulary size (default 129280)")
    p.add_argument("--rows", type=int, default=20, help="rows to build (default 20)")
    p.add_argument("--seed", type=int, default=0, help="request seed for the keyed draws")


def run(args) -> int:
    from pp1q.q import MASS, SEMANTIC_ID, build_row, parse_dense, parse_sparse, sample
    from pp1q.rng import RNG_ABI_ID, proposal_u24

    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    support = []
    for i in range(args.rows):
        logits = rng.normal(size=args.vocab) * 4.0
        top_k = None if i % 2 == 0 else 32
        row = build_row(logits, temperature=0.8, top_k=top_k)
        token = sample(row, proposal_u24(args.seed, 0, 0, i))
        row.require_token(token)
        if parse_dense(row.to_dense(), args.vocab) != row:
            print(f"FAIL: dense round trip of row {i}")
            return 1
        if parse_sparse(*row.to_sparse(), args.vocab) != row:
            print(f"FAIL: sparse round trip of row {i}")
            return 1
        support.append(row.support_size)
        print(f"  row {i + 1:3d}/{args.rows}: {'dense' if top_k is None else 'top-32'} "
              f"support {row.support_size:6d}  token {token}", flush=True)
    dt = time.perf_counter() - t0
    print(f"ok: {args.rows} rows of {args.vocab} tokens, mass {MASS}, q {SEMANTIC_ID}, "
          f"rng {RNG_ABI_ID}; {dt * 1e3 / args.rows:.1f} ms/row")
    return 0
