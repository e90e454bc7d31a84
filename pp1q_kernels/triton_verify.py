"""Triton batched verification step: the GPU form of verify_step.py, same integers.

Launches: per-tile P sums of all B * (D + 1) target rows (the row totals S), then
``_decide`` (one program per request: its own seed, generation, round and first_position;
Philox acceptance draws via tl.philox, exact ratio tests, first rejection, correction
or bonus draw), then the residual pick of triton_residual on each request's chosen row.
Every request reads its own seed (FlashInfer's kernel read seed[0] for the whole batch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.rng import Domain

from .fixed import check_target, check_totals
from .lookup import SparseCounts
from .triton_common import accepts_exact, keyed_u53, to_fixed
from .triton_residual import BLOCK, sample_rows, tile_sums, widen_half
from .verify_step import StepKeys, StepResult, check_keys, check_shapes

_ACCEPTANCE = tl.constexpr(int(Domain.ACCEPTANCE))
_CORRECTION = tl.constexpr(int(Domain.CORRECTION))
_BONUS = tl.constexpr(int(Domain.BONUS))


@triton.jit
def _decide(p_ptr, psum_ptr, q_ptr, qid_ptr, draft_ptr, seed_ptr, gen_ptr, rnd_ptr, first_ptr,
            acc_ptr, prow_ptr, qrow_ptr, u_ptr, bad_ptr, V, NT, K, D: tl.constexpr,
            SPARSE: tl.constexpr, NT_P2: tl.constexpr, K_P2: tl.constexpr):
    # D bounds a Python loop, so it is a compile-time constant: Triton 3.6's interpreter
    # cannot take a runtime loop bound under NumPy >= 2.4 (its scalars are 1-element
    # arrays); a GPU compiles once per depth a deployment uses (1..64; often one)
    b = tl.program_id(0).to(tl.int64)
    seed = tl.load(seed_ptr + b)
    gen = tl.load(gen_ptr + b)
    rnd = tl.load(rnd_ptr + b)
    first_position = tl.load(first_ptr + b)
    tiles = tl.arange(0, NT_P2)
    accepted = b * 0 + D
    done = b * 0
    bad = b * 0
    for i in range(D):
        row = b * (D + 1) + i
        qrow = b * D + i
        s_total = tl.sum(tl.load(psum_ptr + row * NT + tiles, mask=tiles < NT, other=0), axis=0)
        x = tl.load(draft_ptr + qrow).to(tl.int64)
        if SPARSE:
            k = tl.arange(0, K_P2)
            ids = tl.load(qid_ptr + qrow * K + k, mask=k < K, other=V).to(tl.int64)
            cnt = tl.load(q_ptr + qrow * K + k, mask=k < K, other=0).to(tl.int64)
            c = tl.sum(tl.where(ids == x, cnt, 0), axis=0)
        else:
            c = tl.load(q_ptr + qrow * V + x).to(tl.int64)
        p_x = to_fixed(tl.load(p_ptr + row * V + x))
        ok = accepts_exact(keyed_u53(seed, gen, rnd, first_position + i, _ACCEPTANCE), c, p_x,
                           s_total)
        bad = bad | (c <= 0).to(tl.int64)
        now = (done == 0) & (ok == 0)
        accepted = tl.where(now, i, accepted)
        done = done | now.to(tl.int64)
    use_q = accepted < D
    u_corr = keyed_u53(seed, gen, rnd, first_position + accepted, _CORRECTION)
    u_bonus = keyed_u53(seed, gen, rnd, first_position + D, _BONUS)
    tl.store(acc_ptr + b, accepted)
    tl.store(prow_ptr + b, b * (D + 1) + accepted)
    tl.store(qrow_ptr + b, tl.where(use_q, b * D + accepted, -1))
    tl.store(u_ptr + b, tl.where(use_q, u_corr, u_bonus))
    tl.store(bad_ptr + b, bad)


def _p2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def verify_step(p, q, draft, keys: StepKeys, *, validate=True, block=BLOCK) -> StepResult:
    """Same contract and results as verify_step.verify_step, on Triton."""
    draft = draft.to(torch.int64).contiguous()
    check_shapes(p, q, draft)
    B, D1, V = p.shape
    D = D1 - 1
    check_keys(keys, D)
    if validate:
        check_target(p)
    p2d = widen_half(p).reshape(B * D1, V).contiguous()
    psums = tile_sums(p2d, torch.arange(B * D1, device=p.device), block=block)
    if validate:
        check_totals(psums.sum(-1))
    if isinstance(q, SparseCounts):
        q2, qc, qid, k = q.reshape(B * D), q.counts, q.ids, q.width
    else:
        q2 = q.reshape(B * D, V).contiguous()
        qc, qid, k = q2, q2, 1
    out = [torch.empty(B, dtype=torch.int64, device=p.device) for _ in range(5)]
    acc, prow, qrow, u, bad = out
    _decide[(B,)](p2d, psums, qc.contiguous(), qid.contiguous(), draft, keys.seeds,
                  keys.generation, keys.round_id, keys.first_position, acc, prow, qrow, u, bad,
                  V, psums.shape[1], k, D, SPARSE=isinstance(q, SparseCounts),
                  NT_P2=_p2(psums.shape[1]), K_P2=_p2(k))
    if bool(bad.any()):
        raise LocalProtocolError(Reason.ZERO_Q_AT_TOKEN, "a drafted token has q = 0")
    token, under = sample_rows(p2d, prow, q2, qrow, u, psums=psums[prow], block=block)
    return StepResult(acc, token, under)
