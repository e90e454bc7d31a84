"""``pp1q selfcheck``: q rows at full vocabulary, then verification rounds checked twice.

1. Build dyadic24 rows (dense and top-32), sample them with keyed draws, check both
   wire forms round-trip.
2. Run whole rounds the way worker and verifier do (keyed proposals, then standard
   verification) with pp1q.core.verify's float64 reference path (not the verifier's
   pp1q_kernels decision path), and decide each again with the rational oracle: every
   decision must be identical. Small-vocabulary rounds in bulk, plus a few at full
   vocabulary (the oracle needs about half a second per full row).
"""

from __future__ import annotations

import time

import numpy as np

HELP = ("build dyadic24 q rows, sample them with keyed draws, check the round trips, "
        "and check reference-path verification rounds against the rational oracle")

DEPTH = 5  # the seed's production depth
SMALL_VOCAB = 64  # bulk oracle rounds stay fast at this size


def add_arguments(p) -> None:
    p.add_argument("--vocab", type=int, default=129280, help="vocabulary size (default 129280)")
    p.add_argument("--rows", type=int, default=20, help="rows to build (default 20)")
    p.add_argument("--seed", type=int, default=0, help="request seed for the keyed draws")
    p.add_argument("--rounds", type=int, default=400,
                   help=f"oracle-checked rounds at vocab {SMALL_VOCAB} (default 400)")
    p.add_argument("--full-rounds", type=int, default=2,
                   help="oracle-checked rounds at full vocabulary (default 2)")


def _check_rows(args) -> bool:
    from pp1q.core.q import build_row, parse_dense, parse_sparse, sample
    from pp1q.core.rng import proposal_u24

    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    for i in range(args.rows):
        logits = rng.normal(size=args.vocab) * 4.0
        top_k = None if i % 2 == 0 else 32
        row = build_row(logits, temperature=0.8, top_k=top_k)
        token = sample(row, proposal_u24(args.seed, 0, 0, i))
        row.require_token(token)
        if parse_dense(row.to_dense(), args.vocab) != row:
            print(f"FAIL: dense round trip of row {i}")
            return False
        if parse_sparse(*row.to_sparse(), args.vocab) != row:
            print(f"FAIL: sparse round trip of row {i}")
            return False
        print(f"  row {i + 1:3d}/{args.rows}: {'dense' if top_k is None else 'top-32'} "
              f"support {row.support_size:6d}  token {token}", flush=True)
    dt = time.perf_counter() - t0
    print(f"rows ok: {args.rows} rows of {args.vocab} tokens; {dt * 1e3 / max(args.rows, 1):.1f}"
          " ms/row")
    return True


def _round(rng, vocab: int, keys, top_k):
    """Target rows, the worker's q rows and keyed drafts for one round (draft ~ -target)."""
    from pp1q.core.q import build_row, sample
    from pp1q.core.rng import proposal_u24

    target = rng.normal(size=(DEPTH + 1, vocab)) * 3.0
    p = np.exp(target - target.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    mix = rng.uniform(-1.0, 1.0)  # from agreeing (1) to opposed (-1) drafts
    noise = rng.uniform(0.05, 1.0)
    q_rows = [build_row(mix * target[i] + noise * rng.normal(size=vocab), top_k=top_k)
              for i in range(DEPTH)]
    drafts = [sample(q_rows[i], proposal_u24(keys.seed, keys.generation, keys.round_id,
                                             keys.first_position + i)) for i in range(DEPTH)]
    return p, q_rows, drafts


def _check_rounds(args, n: int, vocab: int) -> bool:
    from pp1q.core.reference import RoundDraws, oracle_round
    from pp1q.core.verify import RoundKeys, verify_batch

    rng = np.random.default_rng(args.seed + vocab)
    t0 = time.perf_counter()
    kinds = {"correction": 0, "bonus": 0}
    accepted = 0
    for r in range(n):
        keys = RoundKeys(seed=args.seed, generation=1, round_id=r,
                         first_position=1 + r * (DEPTH + 1))
        p, q_rows, drafts = _round(rng, vocab, keys, top_k=None if r % 2 else 32)
        fast = verify_batch(p[None], [q_rows], [drafts], [keys])[0]
        exact = oracle_round(list(p), q_rows, drafts, RoundDraws.from_keys(keys, DEPTH))
        if fast != exact:
            print(f"FAIL: round {r} at vocab {vocab}: reference path {fast}, oracle {exact}")
            return False
        kinds[fast.kind] += 1
        accepted += fast.accepted
    dt = time.perf_counter() - t0
    print(f"rounds ok: {n} at vocab {vocab}, depth {DEPTH}: reference path == oracle "
          f"({kinds['correction']} corrections, {kinds['bonus']} bonus, "
          f"{accepted / max(n, 1):.2f} accepted/round; {dt:.1f} s)", flush=True)
    return True


def run(args) -> int:
    from pp1q.core.q import MASS, SEMANTIC_ID
    from pp1q.core.rng import RNG_ABI_ID

    print(f"q {SEMANTIC_ID} (mass {MASS}), rng {RNG_ABI_ID}")
    if not _check_rows(args):
        return 1
    if args.rounds and not _check_rounds(args, args.rounds, SMALL_VOCAB):
        return 1
    if args.full_rounds and not _check_rounds(args, args.full_rounds, args.vocab):
        return 1
    print("ok")
    return 0
