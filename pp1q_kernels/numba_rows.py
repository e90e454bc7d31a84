"""Which implementation decides a round on the CPU, and the numba one's driver.

``decide_rows`` decides B rounds exactly as ``lazy_step.decide_rows`` does (the same
integers, the same draws, the same refusals: tests/kernels/test_kernels_numba.py holds
the two to identical decisions over random rounds, draws on exact boundaries included),
with one numba call per request for the ratio tests (pp1q_kernels.numba_step.scan_round:
one pass per reached row, nothing written per entry) and one for the residual pick on
the chosen row. Numpy arrays in, no torch: a CPU verifier's rows never become tensors.

Two differences, both in refusals only, never in a decision both make:
- a row whose entries sum to 2 or more is refused by its exact fixed-point total
  (S >= 2^62); the torch step checks a float64 sum first, whose rounding can refuse a
  row summing to within about 2^-44 of 2 that S still admits (same Reason either way);
- a batch holding several refused rows raises the first request's error (the torch step:
  the first by position). KernelDecider retries a failed batch one round at a time, so
  each round still gets its own error.

Choice, once per process, from ``PP1Q_DECIDE`` (as pp1q.core.q_backend does for q rows):
``auto`` (default) numba when it imports, else torch (lazy_step); ``numba``: numba or a
ConfigError; ``torch``: lazy_step. Only CPU deciders use it; others run lazy_step.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence

import numpy as np

from pp1q.core.backend_choice import BackendChoice
from pp1q.core.errors import DistributionError, LocalProtocolError, Reason
from pp1q.core.q import DyadicRow, dense_row_of_valid
from pp1q.core.verify import RoundKeys
from pp1q.core.verify import round_draws as verify_draws

ENV = "PP1Q_DECIDE"
CHOICE = BackendChoice(ENV, "torch", lambda: importlib.import_module("pp1q_kernels.numba_step"))
chosen = CHOICE.chosen  # (backend, why, numba_step module or None), decided on first use
select = CHOICE.select  # choose explicitly, as PP1Q_DECIDE=want would (pp1q bench)


def _key_field(name: str, values, top: int) -> list[int]:
    """pp1q.core.rng's refusals of a key field (integers in [0, top]), as ints."""
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise LocalProtocolError(Reason.RNG_KEY_OUT_OF_RANGE, f"{name} must be an integer")
        if not 0 <= int(v) <= top:
            raise LocalProtocolError(Reason.RNG_KEY_OUT_OF_RANGE, f"{name} outside [0, {top}]")
    return [int(v) for v in values]


def round_draws(keys: Sequence[RoundKeys], depth: int):
    """(u_acc [B, D], u_corr [B, D], u_bonus [B]) int64: pp1q.core.verify.round_draws,
    computed by numba (pp1q_kernels.numba_draws) when numba decides."""
    if chosen()[2] is None:
        return verify_draws(keys, depth)
    from pp1q_kernels import numba_draws

    word = (1 << 32) - 1
    seeds = _key_field("seed", [k.seed for k in keys], (1 << 64) - 1)
    gen = _key_field("generation", [k.generation for k in keys], (1 << 24) - 1)
    rnd = _key_field("round", [k.round_id for k in keys], word)
    first = _key_field("position", [k.first_position for k in keys], word - depth)
    B = len(keys)
    u_acc, u_corr = np.empty((B, depth), np.int64), np.empty((B, depth), np.int64)
    u_bonus = np.empty(B, np.int64)
    numba_draws.round_draws(np.array([s & word for s in seeds], np.int64),
                            np.array([s >> 32 for s in seeds], np.int64),
                            np.array(gen, np.int64), np.array(rnd, np.int64),
                            np.array(first, np.int64), u_acc, u_corr, u_bonus)
    return u_acc, u_corr, u_bonus


def warm_up() -> tuple[str, str, float]:
    """(backend, why, seconds): choose, and load (or compile) the kernels for both row
    dtypes, so that no round pays it."""
    t0 = time.perf_counter()
    name, why, k = chosen()
    if k is not None:
        one = np.ones(1, np.int64)
        mass = one << 24  # all of q on token 0
        dense = np.zeros(3, np.float32)
        dense[0] = 1.0
        dense.flags.writeable = False  # read where it is, as a received row's q is
        received = np.zeros(1, np.int32)
        received.flags.writeable = False  # a received sparse row's ids, read in place:
        # another specialization of the residual pick, else compiled by the first rejected
        # sparse round on the serving loop (~4 s of CPU, every request stalled)
        rows = (DyadicRow(3, np.zeros(1, np.int32), mass), DyadicRow(3, received, mass),
                dense_row_of_valid(dense, 3))
        for dtype in (np.float64, np.float32):
            p = np.full((2, 3), 1 / 3, dtype=dtype)
            for q in rows:
                for u_acc in (one, one << 52):  # accepted (the bonus pick), rejected (p - q)
                    decide_rows(k, [p], mass[None], [[q]], np.zeros((1, 1), np.int64),
                                u_acc[None], one[None], one)
            target_pick(k, p[0], 1)
        round_draws([RoundKeys(1, 1, 1, 1)], 1)
    return name, why, time.perf_counter() - t0


_NO_IDS, _NO_COUNTS = np.empty(0, np.int32), np.empty(0, np.int64)  # a pick without q


class Scratch:
    """Per-decider buffers: each reached row's block sums and total, the pick's sums."""

    def __init__(self) -> None:
        self.psums = np.empty((0, 0), np.int64)
        self.totals = np.empty(0, np.int64)
        self.sums = np.empty(0, np.int64)

    def fit(self, rows: int, blocks: int) -> None:
        if self.psums.shape != (rows, blocks):
            self.psums = np.empty((rows, blocks), np.int64)
            self.totals = np.empty(rows, np.int64)
            self.sums = np.empty(blocks, np.int64)


def _refusal(k, verdict: int):
    return {
        k.NON_FINITE: DistributionError(Reason.NON_FINITE, "target row is not finite"),
        k.NEGATIVE: DistributionError(Reason.NEGATIVE_VALUE, "negative target probability"),
        k.ABOVE_ONE: DistributionError(Reason.WRONG_MASS, "target probability above 1"),
        k.SUM_TWO: DistributionError(Reason.WRONG_MASS, "target row sums to 2 or more"),
        k.ZERO_MASS: DistributionError(Reason.ZERO_MASS, "target row has no mass at 2^-61"),
    }[verdict]


def _rows(p_rows: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = []
    for p in p_rows:
        p = np.asarray(p)
        if p.dtype == np.float16:
            p = p.astype(np.float32)  # exact widening (fixed.to_fixed does the same)
        elif p.dtype not in (np.float32, np.float64):
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"target rows are {p.dtype}")
        out.append(np.ascontiguousarray(p))  # a copy only for a strided view
    return out


def decide_rows(k, p_rows: Sequence[np.ndarray], c_x: np.ndarray, q_rows, draft: np.ndarray,
                u_acc: np.ndarray, u_corr: np.ndarray, u_bonus: np.ndarray,
                scratch: Scratch | None = None) -> tuple[list[int], list[int], list[bool]]:
    """(accepted, token, underflow) per request, as ``lazy_step.decide_rows`` decides them.

    ``k``: the numba_step module (``chosen()``); ``p_rows[b]`` [D+1, V] float; ``c_x``,
    ``draft``, ``u_acc``, ``u_corr`` [B, D] int64; ``u_bonus`` [B]; ``q_rows[b][i]`` the
    q row (``ids`` ascending int32, ``counts`` int64) that sampled draft i; only the
    chosen rows' are read.
    """
    p_rows = _rows(p_rows)
    c_x, draft = np.asarray(c_x, np.int64), np.asarray(draft, np.int64)
    u_acc, u_corr = np.asarray(u_acc, np.int64), np.asarray(u_corr, np.int64)
    u_bonus = np.asarray(u_bonus, np.int64)
    B = len(p_rows)
    D1, V = p_rows[0].shape if p_rows and p_rows[0].ndim == 2 else (0, 0)
    D = D1 - 1
    if D < 1 or any(p.shape != (D1, V) for p in p_rows) or c_x.shape != (B, D) \
            or draft.shape != (B, D) or u_acc.shape != (B, D) or u_corr.shape != (B, D) \
            or u_bonus.shape != (B,):
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "p, q and draft shapes disagree")
    if int(draft.min()) < 0 or int(draft.max()) >= V:
        raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, "draft id outside vocab")
    if int(c_x.min()) <= 0:
        raise LocalProtocolError(Reason.ZERO_Q_AT_TOKEN, "a drafted token has q = 0")
    scratch = scratch or Scratch()
    scratch.fit(D1, -(-V // k.BLOCK))
    accepted, token, under = [], [], []
    for b, p in enumerate(p_rows):
        verdict, _row, a = k.scan_round(p, c_x[b], draft[b], u_acc[b], scratch.psums,
                                       scratch.totals)
        if verdict != k.OK:
            raise _refusal(k, verdict)
        if a == D:  # the bonus row: a pick from p alone
            t, u = k.pick(p[a], scratch.totals[a], scratch.psums[a], scratch.sums, _NO_IDS,
                          _NO_COUNTS, False, u_bonus[b])
        else:
            t, u = _residual_pick(k, p[a], q_rows[b][a], scratch.totals[a],
                                  scratch.psums[a], scratch.sums, u_corr[b, a])
        if t < 0:  # unreachable by construction; never hand it out
            raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, "pick fell past the last id")
        accepted.append(int(a))
        token.append(int(t))
        under.append(bool(u))
    return accepted, token, under


def _residual_pick(k, p: np.ndarray, q: DyadicRow, s_total, psums, sums, u53):
    """(id, underflow): the correction on a rejected row, max(p - q, 0) resampled. A row
    that holds its whole FP32 q (``DyadicRow.dense_q``: a received dense row validated
    in place, or one build_row built) is read as FP32 (no support extracted; ~20x faster
    than the walk of its 129k ids); any other, or one of another vocabulary, by its ids.
    Bounds before the kernel reads (it runs without bounds checks)."""
    V = p.size
    dense = q.dense_q()
    if dense is not None and q.vocab <= V <= dense.size and dense.ndim == 1 \
            and dense.dtype == np.float32:  # all its mass below V, V entries to read
        return k.pick_dense(p, s_total, psums, sums, dense, u53)
    # DyadicRow holds ascending ids, so the first and last decide the range
    if q.counts.shape != q.ids.shape or q.ids.ndim != 1:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "q ids and counts differ")
    if q.ids.size and (int(q.ids[-1]) >= V or int(q.ids[0]) < 0):
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "q vocab differs from p")
    return k.pick(p, s_total, psums, sums, np.ascontiguousarray(q.ids, np.int32), q.counts,
                  True, u53)


def target_pick(k, p_row: np.ndarray, u53: int, scratch: Scratch | None = None) -> int:
    """The inverse-CDF pick over one row p [V] itself (a target-only step), as
    ``residual.target_sample`` decides it."""
    (p,) = _rows([p_row])
    if p.ndim != 1 or not p.size:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "target-only needs one row")
    scratch = scratch or Scratch()
    scratch.fit(1, -(-p.size // k.BLOCK))
    verdict, s = k.scan_row(p, scratch.psums[0])
    if verdict != k.OK:
        raise _refusal(k, verdict)
    t, _ = k.pick(p, s, scratch.psums[0], scratch.sums, _NO_IDS, _NO_COUNTS, False, int(u53))
    if t < 0:
        raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, "pick fell past the last id")
    return int(t)
