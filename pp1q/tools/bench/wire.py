"""Wire v2: decode + validate a 4-request x depth-5 reply set, against np.copy.

Dense: 20 rows of 129280 FP32 values (10.34 MB of q) through the VerifierEndpoint, from
bytes to ``ProposalReady`` with every check done, timed against ``np.copy`` of the same
bytes in the same run (the cost of touching them once). Sparse k=32: the same path
framed row by row (REPLYs and a COMPLETION, as revision 2 framed every sparse step and a
step too large for one PROPOSAL still is), where fixed per-frame costs dominate; the
daemons send a fitting sparse step as one PROPOSAL (``pp1q bench round``). Each timed
call gets a verifier that has made its handshake and sent its STEPs (untimed: not the
receive path's cost; until 1 Dec 2026 the figures included it, ~4 us a sparse row).
"""

from __future__ import annotations

import importlib.util
import time

import numpy as np

from pp1q.core import q_backend
from pp1q.core.prefix import digest_of
from pp1q.core.q import SEMANTIC_ID, build_row, parse_dense, sample, validate_dense
from pp1q.core.rng import RNG_ABI_ID, proposal_u24
from pp1q.wire import (
    Form,
    FrameDecoder,
    Identity,
    Limits,
    PayloadPool,
    ProposalReady,
    Step,
    VerifierEndpoint,
    WireConfig,
    WorkerEndpoint,
    context_of,
    reply_from_row,
)

TITLE = "Wire v2 (decode + validate, 4 requests x depth 5)"
VOCAB = 129280
REQUESTS, DEPTH = 4, 5
SESSION = 1


def _config() -> WireConfig:
    ident = Identity(q_semantic_id=SEMANTIC_ID, verifier_id="standard-v1", vocab=VOCAB,
                     id_map_hash="bench", draft_id="bench", draft_adapted=False,
                     target_id="bench", rng_abi=RNG_ABI_ID, precision="fp32-le")
    return WireConfig(identity=ident, limits=Limits.make(vocab=VOCAB, max_support=256),
                      versions=(2,))


PREFIX = list(range(100))  # each slot's committed context: positions 0..99


def _steps(top_k: int) -> list[Step]:
    return [Step(session=SESSION, slot=s, generation=1, round_id=1, last_committed=99,
                 first_position=100, prefix_digest=digest_of(PREFIX), depth=DEPTH,
                 temperature=0.8, top_k=top_k, context_version=0, seed=s)
            for s in range(REQUESTS)]


def _round(top_k: int, seed: int = 0):
    """(verifier factory, worker bytes) for one round of REQUESTS steps."""
    cfg = _config()
    rng = np.random.default_rng(seed)
    v0 = VerifierEndpoint(cfg, session=SESSION)
    w = WorkerEndpoint(cfg, check_outgoing=False)
    w.receive_data(v0.hello(), 0.0)
    answer = w.data_to_send()
    v0.receive_data(answer, 0.0)
    steps = _steps(top_k)
    w.receive_data(b"".join(v0.send(context_of(session=SESSION, slot=s.slot, generation=1,
                                               tokens=PREFIX, digest=digest_of(PREFIX)))
                            for s in steps), 0.0)  # a STEP needs the slot's context
    w.receive_data(b"".join(v0.send(s, now=0.0) for s in steps), 0.0)
    frames = []
    for st in steps:
        for i in range(DEPTH):
            # logits spread like a real drafter's: a few strong tokens, a long tail
            row = build_row(rng.standard_normal(VOCAB) * 3.0, temperature=0.8,
                            top_k=top_k or None)
            tok = sample(row, proposal_u24(st.seed, 1, 1, st.first_position + i))
            frames.append(w.send(reply_from_row(
                session=SESSION, slot=st.slot, generation=1, round_id=1, index=i + 1,
                position=st.first_position + i, token=tok, row=row,
                form=Form.SPARSE if top_k else Form.DENSE)))
        frames.append(w.send(w.completion(st.slot)))

    # steady state of a daemon: payload buffers preallocated once, reused every round
    pool = PayloadPool(4 * REQUESTS * DEPTH * cfg.limits.max_payload)
    pool.preallocate(cfg.limits.dense_row_bytes, 2 * REQUESTS * DEPTH)

    def fresh_verifier() -> VerifierEndpoint:
        v = VerifierEndpoint(cfg, session=SESSION, pool=pool)
        v.hello()
        v.receive_data(answer, 0.0)
        for st in steps:
            v.send(st, now=0.0)
        return v

    fresh_verifier.pool = pool
    return fresh_verifier, b"".join(frames)


def _best(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def checkers() -> list[str]:
    """The q-row checkers this machine can run (pp1q.core.q_backend)."""
    return ["numpy"] + (["numba"] if importlib.util.find_spec("numba") else [])


def _best_per_checker(fn, reps: int, setup=None, baseline=None) -> dict[str, float]:
    """Best seconds of ``fn`` under each checker, the checkers alternated every
    repetition (a shared machine's load then falls on both alike). ``setup``: made
    before each timed call, untimed, its result passed to ``fn`` (a fresh verifier:
    its handshake and STEPs are not the receive path's cost). ``baseline``: a function
    timed in the same alternation, its best under the key "baseline"."""
    names = checkers()
    before = q_backend.backend()
    best = dict.fromkeys([*names, "baseline"] if baseline else names, float("inf"))

    def once() -> float:
        arg = () if setup is None else (setup(),)
        t0 = time.perf_counter()
        fn(*arg)
        return time.perf_counter() - t0

    try:
        for name in names:  # warm-up: the first call loads the kernels
            q_backend.select(name)
            once()
        for _ in range(reps):
            for name in names:
                q_backend.select(name)
                best[name] = min(best[name], once())
            if baseline is not None:
                best["baseline"] = min(best["baseline"], _best(baseline, 1))
    finally:
        q_backend.select(before)
    return best


def _validated(v: VerifierEndpoint, events) -> None:
    ready = [e for e in events if isinstance(e, ProposalReady)]
    if len(ready) != REQUESTS:
        raise RuntimeError(f"benchmark round did not validate: {events!r}")


def _feed_chunks(v: VerifierEndpoint, stream: bytes, chunk: int) -> list:
    mv, out = memoryview(stream), []
    for i in range(0, len(stream), chunk):
        out += v.receive_data(mv[i:i + chunk], 0.0)
    return out


def _feed_recv_into(v: VerifierEndpoint, stream: bytes) -> list:
    """BufferedProtocol path: the copy into get_buffer() stands in for recv_into."""
    mv, pos, out = memoryview(stream), 0, []
    while pos < len(stream):
        buf = v.get_buffer()
        n = min(len(buf), len(stream) - pos)
        buf[:n] = mv[pos:pos + n]
        pos += n
        out += v.buffer_updated(n, 0.0)
    return out


def run(quick: bool = False) -> list[str]:
    reps = 3 if quick else 15
    names = checkers()
    lines = []
    fresh, stream = _round(top_k=0)
    raw = np.frombuffer(stream, dtype=np.uint8)
    t_copy = _best(lambda: np.copy(raw), reps)

    def whole(v):
        _validated(v, v.receive_data(stream, 0.0))

    def chunks(v):
        _validated(v, _feed_chunks(v, stream, 64 * 1024))

    def recv_into(v):
        _validated(v, _feed_recv_into(v, stream))

    def decode_only():
        FrameDecoder(_config().limits, fresh.pool).feed(stream)

    whole(fresh())  # warm up (and prove the round validates)
    before = q_backend.select("numpy")  # numba would check dense q while copying it
    try:
        t_dec = _best(decode_only, reps)
    finally:
        q_backend.select(before)
    q_bytes = REQUESTS * DEPTH * VOCAB * 4
    lines.append(f"dense: {len(stream):,} frame bytes ({q_bytes:,} of q), "
                 f"np.copy {t_copy * 1e3:.2f} ms ({len(stream) / t_copy / 1e9:.1f} GB/s); "
                 f"dense rows checked by: {' | '.join(names)} (alternated)")
    lines.append(f"  {'decode only (framing, checksums)':<36} {t_dec * 1e3:7.2f} ms  = "
                 f"{t_dec / t_copy:5.1f}x np.copy")

    def show(name: str, best: dict[str, float], rows: int = 0) -> None:
        """``rows``: ``best`` is per row; the ratio is for that many rows."""
        unit = " ms/row" if rows else " ms"
        cells = "  |".join(f" {best[n] * 1e3:7.2f}{unit} = {best[n] * (rows or 1) / t_copy:5.1f}x"
                           for n in names)
        lines.append(f"  {name:<36}{cells}")

    for name, fn in [("decode + validate, one feed", whole),
                     ("decode + validate, 64 KiB feeds", chunks),
                     ("decode + validate, recv_into path", recv_into)]:
        show(name, _best_per_checker(fn, reps, fresh))
    row = build_row(np.random.default_rng(1).standard_normal(VOCAB) * 3.0, temperature=0.8)
    q = row.to_dense()
    rows = REQUESTS * DEPTH
    show(f"parse_dense x{rows} (support {row.support_size:,})",
         _best_per_checker(lambda: parse_dense(q, VOCAB), reps * 4), rows)
    show(f"validate_dense x{rows}", _best_per_checker(lambda: validate_dense(q, VOCAB),
                                                       reps * 4), rows)

    fresh_s, stream_s = _round(top_k=32)

    def sparse(v):
        _validated(v, v.receive_data(stream_s, 0.0))

    sparse(fresh_s())
    t_sparse = _best_per_checker(sparse, reps * 4, fresh_s)
    t_sparse_copy = _best(lambda: np.copy(np.frombuffer(stream_s, np.uint8)), reps * 4)
    lines.append(f"sparse k=32: {len(stream_s):,} frame bytes (np.copy "
                 f"{t_sparse_copy * 1e6:.1f} us), decode + validate per row | per round:")
    lines.append("  " + "  |".join(f" {n}: {t_sparse[n] / rows * 1e6:.1f} us | "
                                   f"{t_sparse[n] * 1e3:.2f} ms" for n in names))
    return lines
