"""The verification step reading only the target rows a round reaches (kernel 6, lazily).

``verify_step.decide`` puts every row of every request in fixed point first: B * (D+1)
full-vocabulary passes (to_fixed, block sums) although a request rejected at position i
never reads rows i+1..D. Here the acceptance tests run position by position over the
requests still accepting: row i of a request is checked, put in fixed point and summed
only if its drafts 1..i-1 were all accepted; then each request's chosen row (its first
rejection, or its bonus row) goes to the same residual pick. Same integers, same draws,
so the decisions are bit-identical to ``verify_step.decide`` (tests/kernels) for every
input both accept. One difference in refusals: a bad target row that no decision reads
is not refused (as the rational oracle, which converts only the rows a round reaches).

Rows come per request (``p_rows[b]`` [D+1, V] float, any tensors on one device: a
verifier's per-slot buffers need no stacking copy); ``work`` is a reused int64 buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from pp1q.core.errors import LocalProtocolError, Reason

from .fixed import block_sums, check_rows, check_totals, to_fixed
from .lookup import SparseCounts
from .residual import BLOCK, sample_fixed
from .verify_step import StepResult, check_drafted, first_rejection


def decide_rows(p_rows: Sequence[torch.Tensor], c_x: torch.Tensor, q_at: Callable,
                draft, u_acc, u_corr, u_bonus, *, work: torch.Tensor | None = None,
                validate=True) -> StepResult:
    """``verify_step.decide`` with explicit draws, rows given per request.

    ``c_x`` [B, D]: the q count of each draft; ``q_at(i)`` with i [B] (positions, a CPU
    tensor): the q rows of request b at position i[b], [B] dense or SparseCounts on p's
    device (only the chosen rows are ever asked for: a verifier need not stack every q
    row of a round).

    On a GPU every flag read waits for the device, so each position reads its rows'
    checks, totals and ratio tests once each, not per row, and the accepted counts are
    kept on the host as they are decided (the refusals are still the first failing
    row's, position by position, as checking one row at a time gives).
    """
    B = len(p_rows)
    D1, V = p_rows[0].shape
    D = D1 - 1
    dev = p_rows[0].device
    draft = draft.to(torch.int64)
    if any(tuple(p.shape) != (D1, V) for p in p_rows) or tuple(c_x.shape) != (B, D) \
            or tuple(draft.shape) != (B, D) or D < 1:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "p, q and draft shapes disagree")
    c_x = c_x.to(torch.int64)
    bad_id, zero_q = torch.stack([((draft < 0) | (draft >= V)).any(),
                                  (c_x <= 0).any()]).tolist()  # one read for both
    if bad_id:
        raise LocalProtocolError(Reason.ID_OUT_OF_RANGE, "draft id outside vocab")
    if zero_q:
        check_drafted(c_x)  # raises
    if work is None or work.numel() < B * D1 * V:
        work = torch.empty(B * D1 * V, dtype=torch.int64, device=dev)
    P = work[: B * D1 * V].view(B, D1, V)
    s_total = torch.zeros((B, D1), dtype=torch.int64, device=dev)
    accepted = [D] * B  # on the host: each is known once its rejection is read
    alive = list(range(B))

    def fixed_rows(i: int) -> None:  # row i of every alive request: checked, P, S
        if validate:
            check_rows([p_rows[b][i] for b in alive])
        for b in alive:
            s_total[b, i] = to_fixed(p_rows[b][i], P[b, i]).sum()
        if validate:
            check_totals(s_total[torch.tensor(alive, device=dev), i])

    for i in range(D):  # position by position, over the requests still accepting
        fixed_rows(i)
        rows = torch.tensor(alive, dtype=torch.int64, device=dev)
        p_x = P[rows, i, draft[rows, i]].unsqueeze(-1)
        rej = first_rejection(u_acc[rows, i].unsqueeze(-1), c_x[rows, i].unsqueeze(-1), p_x,
                              s_total[rows, i].unsqueeze(-1)) == 0
        for b, r in zip(list(alive), rej.tolist(), strict=True):
            if r:
                accepted[b] = i
                alive.remove(b)
        if not alive:
            break
    if alive:  # every draft accepted: the bonus row decides
        fixed_rows(D)
    acc = torch.tensor(accepted, dtype=torch.int64, device=dev)
    b = torch.arange(B, device=dev)
    chosen = P[b, acc]  # a copy: the pick edits it in place
    use_q = acc < D
    qi = acc.clamp(max=D - 1)
    u = torch.where(use_q, u_corr.gather(-1, qi.unsqueeze(-1)).squeeze(-1), u_bonus)
    q_rows = q_at(torch.tensor([min(a, D - 1) for a in accepted], dtype=torch.int64))
    if (q_rows.vocab if isinstance(q_rows, SparseCounts) else q_rows.shape[-1]) != V:
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "q vocab differs from p")
    token, under = sample_fixed(chosen, s_total[b, acc], q_rows, u, use_q=use_q,
                                psums=block_sums(chosen, BLOCK),
                                fresh=lambda rows: P[rows, acc[rows]])
    return StepResult(acc, token, under)
