"""Sampled rounds decided together: every round queued in one loop tick, one
``KernelRounds.sampled`` call per shape (pp1q_kernels, exact integers, on its device).

The first round queued in a tick schedules one flush (``call_soon``); rounds queued
before it runs join it. The rounds of a tick are the proposals that became ready
together: the link hands out every ProposalReady of one read in one tick, and a real
model's target scores its queued requests in one forward whose results resolve in one
tick (pp1q.verifier.engine_decider). Batching changes no decision: each round keeps its
own keys, and KernelRounds decides a batch as it decides each round alone (tests/kernels).

If a batch fails (a target row refused), each of its rounds is decided alone, so an
error reaches only the request whose rows caused it. A round whose waiter was cancelled
before the flush is skipped: its slot (and a target-row buffer it views) may already be
another request's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pp1q.core.q import DyadicRow
from pp1q.core.verify import RoundKeys
from pp1q.verifier.kernel_rounds import KernelRounds
from pp1q.verifier.outcome import Outcome


@dataclass(frozen=True)
class _Queued:
    # [D+1, V]: numpy, or a tensor on the kernel's device; may view a slot's buffer, read
    # by the flush
    p: np.ndarray | torch.Tensor
    q_rows: Sequence[DyadicRow]
    drafts: list[int]
    keys: RoundKeys
    done: asyncio.Future


class RoundBatch:
    """The sampled rounds of one decider, decided a loop tick's worth at a time."""

    def __init__(self, kernel: KernelRounds) -> None:
        self.kernel = kernel
        self._queued: list[_Queued] = []

    async def decide(self, p: np.ndarray | torch.Tensor, q_rows: Sequence[DyadicRow],
                     drafts: list[int], keys: RoundKeys) -> Outcome:
        """One round's outcome, decided with the other rounds queued in this tick."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._queued.append(_Queued(p, q_rows, drafts, keys, done))
        if len(self._queued) == 1:
            loop.call_soon(self._flush)
        return await done

    def _flush(self) -> None:
        queued = [r for r in self._queued if not r.done.done()]
        self._queued = []
        groups: dict[tuple, list[_Queued]] = {}
        for r in queued:
            groups.setdefault(r.p.shape, []).append(r)
        for batch in groups.values():
            try:
                self._decide(batch)
            except Exception:  # noqa: BLE001 - retried alone: each error to its own round
                for r in batch:
                    try:
                        self._decide([r])
                    except Exception as e:  # noqa: BLE001 - handed to the awaiting round
                        r.done.set_exception(e)

    def _decide(self, batch: list[_Queued]) -> None:
        outs = self.kernel.sampled([r.p for r in batch], [r.q_rows for r in batch],
                                   [r.drafts for r in batch], [r.keys for r in batch])
        for r, out in zip(batch, outs, strict=True):
            r.done.set_result(out)
