"""Sampled rounds and target-only picks decided through pp1q_kernels (exact integers).

The service's decision rule for sampled rounds, whoever calls it: KernelDecider and
EngineDecider batch the rounds of one loop tick through one ``KernelRounds``
(pp1q.verifier.round_batch); pp1q.verifier.rounds decides one round at a time the same
way (rank replicas, replay, planted-bug deciders).

Target rows p enter in fixed point, P = floor(p * 2^61), and a round uses P / S with
S = sum(P) (docs/kernels.md). Every P * 2^-61 is a float64 (P >= 2^53 only where p >= 2^-8,
where p is already a multiple of 2^-61), so the decisions equal the rational oracle's
(pp1q.core.reference) on the rows floor(p * 2^61) / 2^61 exactly, rows within 2^-61 of p
per entry (tests/verifier/test_decider_qualification.py).

Draws: the contract's keyed Philox draws come from pp1q.core.verify (``round_draws``,
``target_only_draw``), the functions the float64 reference path draws with, and reach
the kernel explicitly (on CPU the kernel's own keyed draws cost ~40 tiny torch ops);
where numba decides, a round's draws are the same words computed in one numba call
(pp1q_kernels.numba_rows.round_draws: ~0.2 ms of numpy calls otherwise).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.q import DyadicRow
from pp1q.core.verify import RoundKeys, target_only_draw
from pp1q.verifier.outcome import Outcome
from pp1q_kernels import numba_rows
from pp1q_kernels.lazy_step import decide_rows
from pp1q_kernels.lookup import from_rows
from pp1q_kernels.residual import target_sample


def warm_up_decisions() -> None:
    """Choose the CPU decision path (PP1Q_DECIDE) and load its kernels before serving, so
    no round (nor a target-only step) pays numba's kernel load; a bad PP1Q_DECIDE raises
    ConfigError here: the daemon refuses to start (status 2)."""
    name, why, seconds = numba_rows.warm_up()
    logging.getLogger("pp1q.verifier").info("sampled rounds decided by %s (%s), loaded in "
                                            "%.2f s", name, why, seconds)


def _tensor(a, device: torch.device) -> torch.Tensor:
    """``a`` (an array, or a tensor on any device) on ``device``: no copy where it is."""
    return torch.as_tensor(a, device=device)


def _host(a):
    """What the numba path reads: an array as it is, a CPU tensor's own memory (a tensor
    on another device raises: its decisions belong on its device, not here)."""
    return a.numpy() if isinstance(a, torch.Tensor) else a


class KernelRounds:
    """Decisions on one device, reading only the target rows a round reaches: on the CPU
    pp1q_kernels.numba_rows when numba is chosen (PP1Q_DECIDE: one pass per reached row,
    numpy arrays in: a CPU tensor's own memory), else pp1q_kernels.lazy_step (torch,
    reusing one int64 work buffer for the fixed-point rows). Both decide identically
    (tests/kernels)."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self._work = torch.empty(0, dtype=torch.int64, device=device)
        self.device = self._work.device  # "cuda" named as the tensors are: cuda:0
        self._numba = numba_rows.chosen()[2] if self.device.type == "cpu" else None
        self._scratch = numba_rows.Scratch()

    def sampled(self, p_rows: Sequence, q_rows: Sequence[Sequence[DyadicRow]],
                drafts: Sequence[Sequence[int]], keys: Sequence[RoundKeys]) -> list[Outcome]:
        """Standard verification of B rounds of one depth D: ``p_rows[b]`` [D+1, V]
        (row D for the bonus; numpy, or a torch tensor: on this device it is read where
        it is), ``q_rows[b]`` the D q rows that sampled ``drafts[b]``."""
        B = len(keys)
        if not B or len(p_rows) != B or len(q_rows) != B or len(drafts) != B:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "batch sizes disagree")
        D = len(drafts[0])
        shape = np.shape(p_rows[0])
        if D < 1 or any(len(x) != D for x in drafts) or any(len(c) != D for c in q_rows) \
                or len(shape) != 2 or any(np.shape(p) != shape for p in p_rows) \
                or shape[0] != D + 1:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "need D q rows, D drafts, D+1 p rows")
        if any(r.vocab != shape[1] for chain in q_rows for r in chain):
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "q vocab differs from p")
        draws = numba_rows.round_draws(keys, D)  # pp1q.core.verify's, by numba when it decides
        c_x = [[row.require_token(int(x)) for row, x in zip(chain, xs, strict=True)]
               for chain, xs in zip(q_rows, drafts, strict=True)]
        if self._numba is not None:
            acc, tok, _ = numba_rows.decide_rows(self._numba, [_host(p) for p in p_rows],
                                                 np.array(c_x, np.int64),
                                                 q_rows, np.array(drafts, np.int64), *draws,
                                                 scratch=self._scratch)
            return [Outcome(a, t) for a, t in zip(acc, tok, strict=True)]
        p = [_tensor(rows, self.device) for rows in p_rows]
        u_acc, u_corr, u_bonus = (_tensor(u.astype(np.int64), self.device) for u in draws)
        c_x = torch.tensor(c_x, dtype=torch.int64, device=self.device)

        def q_at(i: torch.Tensor):  # only the chosen rows become a kernel batch
            return from_rows([chain[k] for chain, k in zip(q_rows, i.tolist(), strict=True)],
                             device=self.device)

        need = B * (D + 1) * shape[1]
        if self._work.numel() < need:  # grows to the largest batch seen, then stays
            self._work = torch.empty(need, dtype=torch.int64, device=self.device)
        res = decide_rows(p, c_x, q_at, torch.tensor(drafts, dtype=torch.int64, device=self.device),
                          u_acc, u_corr, u_bonus, work=self._work)
        accepted, token = torch.stack([res.accepted, res.token]).tolist()  # one read
        return [Outcome(a, t) for a, t in zip(accepted, token, strict=True)]

    def target_only(self, p_row, keys: RoundKeys, position: int) -> Outcome:
        """One token at absolute ``position`` from p alone (TARGET_ONLY draw); ``p_row``
        [V] as ``sampled`` takes its rows."""
        if self._numba is not None:
            return Outcome(0, numba_rows.target_pick(self._numba, _host(p_row),
                                                     target_only_draw(keys, position),
                                                     self._scratch))
        t = _tensor(p_row, self.device)
        if t.ndim != 1:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "target-only needs one row")
        u = torch.tensor([target_only_draw(keys, position)], dtype=torch.int64,
                         device=self.device)
        return Outcome(0, int(target_sample(t[None], u)[0]))
