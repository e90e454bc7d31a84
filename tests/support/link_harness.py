"""The verifier's WorkerLink against an in-process FakeWorker (fake_worker.py): the link
as the daemon builds it, one STEP for a slot, a bounded wait, and ``linked``, which runs
the pair for one test and always stops both (every link test had its own copy of that
start and teardown)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fake_worker import FakeWorker
from wire_helpers import config
from wire_vectors import LIMITS

from pp1q.core.prefix import Prefix
from pp1q.runtime.metrics import Metrics
from pp1q.verifier.link import Needs, WorkerLink
from pp1q.wire import Step

WAIT_S = 20.0  # bound on every wait; the loopback steps take milliseconds
PROMPT = [1, 2, 3]


def make_link(port: int, metrics: Metrics | None = None, step_timeout: float = 5.0,
              **kw) -> WorkerLink:
    return WorkerLink("127.0.0.1", port, config(versions=(2,)),
                      Needs(slots=LIMITS.max_slots, depth=3, support=4),
                      metrics or Metrics("verifier"), step_timeout, 0.2, **kw)


@contextlib.asynccontextmanager
async def running(link: WorkerLink) -> AsyncIterator[WorkerLink]:
    """``link.run`` as a task for the block; stopped and awaited (bounded) after it."""
    stop = asyncio.Event()
    task = asyncio.create_task(link.run(stop))
    try:
        yield link
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT_S)


@contextlib.asynccontextmanager
async def linked(worker: FakeWorker, *args, **kw) -> AsyncIterator[WorkerLink]:
    """``worker`` started and a running link to it (``make_link``'s arguments after the
    port); the link stopped, then the worker closed, however the block ends."""
    await worker.start()
    try:
        async with running(make_link(worker.port, *args, **kw)) as link:
            yield link
    finally:
        await worker.close()


def step_for(link: WorkerLink, slot: int = 0, generation: int = 1, round_id: int = 1) -> Step:
    prefix = Prefix(PROMPT)
    assert link.send_context(slot, generation, prefix, 0)
    return Step(session=link.session, slot=slot, generation=generation, round_id=round_id,
                last_committed=len(PROMPT) - 1, first_position=len(PROMPT),
                prefix_digest=prefix.digest, depth=3, temperature=0.8, top_k=0,
                context_version=0, seed=11)


async def until(predicate, what: str) -> None:
    async with asyncio.timeout(WAIT_S):
        while not predicate():
            await asyncio.sleep(0.01)
    assert predicate(), what
