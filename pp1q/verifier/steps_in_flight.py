"""The link's STEPs in flight: which slots' outcomes are awaited, grouped in batches
(the STEPs one write sent), at most ``MAX_BATCHES_IN_FLIGHT`` of them (the design's two
rounds in flight: while the verifier decides one batch, the worker drafts the next).

Sans-IO bookkeeping for pp1q.verifier.link: it holds the futures, never writes. A slot's
outcome (a proposal, a failure, a RESET) frees its place; a batch with no place left is
gone, and the link may send the STEPs queued behind it. Also the payload buffers those
batches' replies land in, sized from the negotiated limits (``slot_buffers``).
"""

from __future__ import annotations

import asyncio

from pp1q.wire import Limits
from pp1q.wire.pool import PayloadPool

MAX_BATCHES_IN_FLIGHT = 2  # the design's two in-flight STEP batches


def slot_rows(limits: Limits) -> int:
    """Dense rows two in-flight batches of every slot hold (the seed's 2 x 4 x 5)."""
    return MAX_BATCHES_IN_FLIGHT * limits.max_slots * limits.max_depth


def slot_buffers(limits: Limits, *, allocate: bool = True) -> PayloadPool:
    """The link's payload buffers, sized from ``limits``: two in-flight batches of every
    slot's dense rows (2 x 4 x 5 x 517 KB at 129280 tokens), allocated and touched now
    unless ``allocate`` is False (then ``PayloadPool.preallocate`` later: the link
    allocates them once a v2 session is negotiated, the design's order). Small rows come
    from malloc (see PayloadPool)."""
    pool = PayloadPool(slot_rows(limits) * limits.dense_row_bytes)
    if allocate:
        pool.preallocate(limits.dense_row_bytes, slot_rows(limits))
    return pool


class StepsInFlight:
    def __init__(self, gauge) -> None:
        self._gauge = gauge  # pp1q_steps_in_flight: a place held with no round running shows
        self._waiters: dict[int, asyncio.Future] = {}  # slot -> outcome of its open STEP
        self._batches: list[set[int]] = []

    @property
    def has_room(self) -> bool:
        """Another batch may leave now."""
        return len(self._batches) < MAX_BATCHES_IN_FLIGHT

    def add(self, waiters: dict[int, asyncio.Future]) -> None:
        """One write's STEPs left: their slots' outcomes are awaited as one batch."""
        if not waiters:
            return
        self._waiters.update(waiters)
        self._batches.append(set(waiters))
        self._count()

    def resolve(self, slot: int, outcome) -> bool:
        """``slot``'s STEP ended with ``outcome``; True when that emptied a batch (a place
        for the STEPs queued behind it)."""
        fut = self._waiters.pop(slot, None)
        if fut is not None and not fut.done():
            fut.set_result(outcome)
        for batch in self._batches:
            batch.discard(slot)
        emptied = any(not b for b in self._batches)
        if emptied:
            self._batches = [b for b in self._batches if b]
        self._count()
        return emptied

    def clear(self) -> None:
        """The session ended (its endpoint failed every open STEP first)."""
        self._batches.clear()
        self._count()

    def _count(self) -> None:
        # two places held with no round running once stopped every STEP (a RESET now
        # resolves its slot's STEP); the gauge shows such a leak directly
        self._gauge.set(sum(len(b) for b in self._batches))
