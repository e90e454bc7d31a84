"""The slot pool's hand-out and queue shares (pp1q.verifier.slot_pool), request by
request: a freed slot goes to the waiting client that holds the fewest slots (the first
come among equals), one client's queue share is bounded, and a lone client is served
first come, first served. A plain FIFO pool fails the first test."""

from __future__ import annotations

import asyncio

import pytest

from pp1q.core.errors import Reason, ServiceError
from pp1q.runtime.metrics import Metrics
from pp1q.verifier import slot_pool
from pp1q.verifier.slot_pool import SlotPool


def _pool(n: int, per_address: int = 0) -> SlotPool:
    return SlotPool(n, Metrics("verifier"), per_address)


async def _queue(pool: SlotPool, *addresses: str) -> list[asyncio.Task]:
    """One waiting request per address, in this order (each in the queue on return)."""
    tasks = []
    for a in addresses:
        tasks.append(asyncio.ensure_future(pool.acquire(a)))
        await asyncio.sleep(0)
    return tasks


async def _served(pool: SlotPool, tasks: list[asyncio.Task], slot: int) -> int:
    """Free ``slot``; which of ``tasks`` (its index) got it."""
    pool.release(slot)
    await asyncio.sleep(0)
    done = [i for i, t in enumerate(tasks)
            if t.done() and not t.cancelled() and t.result() == slot]
    assert len(done) == 1, done
    return done[0]


async def test_a_freed_slot_goes_to_the_client_holding_fewest():
    pool = _pool(2)
    held = [await pool.acquire("a"), await pool.acquire("a")]  # a holds both
    tasks = await _queue(pool, "a", "a", "b")  # a's backlog, then one request of b's
    assert await _served(pool, tasks, held[0]) == 2  # b, ahead of a's backlog
    assert await _served(pool, tasks, held[1]) == 0  # then a's, first come first
    pool.release(tasks[2].result())
    await asyncio.sleep(0)
    assert tasks[1].done()
    assert pool.metrics.value("pp1q_requests_queued") == 0


async def test_equals_are_served_first_come_and_a_lone_client_in_order():
    pool = _pool(1)
    slot = await pool.acquire("x")
    tasks = await _queue(pool, "c", "d", "c")  # c and d hold none: c came first
    order = []
    for _ in range(3):
        i = await _served(pool, tasks, slot)
        order.append(i)
        slot, tasks[i] = tasks[i].result(), asyncio.Future()  # served: out of the running
    assert order == [0, 1, 2]


async def test_one_address_holds_its_share_of_the_queue_and_the_queue_is_bounded(monkeypatch):
    monkeypatch.setattr(slot_pool, "MAX_QUEUED_REQUESTS", 3)
    pool = _pool(2, per_address=2)
    await pool.acquire("a")  # a holds a slot
    slot = await pool.acquire("x")
    tasks = await _queue(pool, "a", "a")
    with pytest.raises(ServiceError) as e:
        await pool.acquire("a")
    assert e.value.reason is Reason.TOO_MANY_QUEUED_FROM_ADDRESS
    tasks += await _queue(pool, "b")  # another address still queues
    with pytest.raises(ServiceError) as e:
        await pool.acquire("c")
    assert e.value.reason is Reason.QUEUE_FULL
    tasks[0].cancel()  # a client leaves the queue: its share comes back
    await asyncio.sleep(0)
    tasks += await _queue(pool, "a")
    assert await _served(pool, tasks, slot) == 2  # b (holds none), not a's (holds one)


async def test_no_share_means_any_number_from_one_address(monkeypatch):
    monkeypatch.setattr(slot_pool, "MAX_QUEUED_REQUESTS", 3)
    pool = _pool(1, per_address=0)
    await pool.acquire("p")
    tasks = await _queue(pool, "p", "p", "p")  # a proxy: every client has its address
    assert not any(t.done() for t in tasks)
    with pytest.raises(ServiceError) as e:
        await pool.acquire("p")
    assert e.value.reason is Reason.QUEUE_FULL
    for t in tasks:
        t.cancel()


async def test_a_waiter_cancelled_in_the_same_tick_does_not_strand_a_free_slot():
    """A slot freed while the only waiter's cancellation is still pending goes to the
    free list; a request arriving then takes it at once, not behind the dead waiter."""
    pool = _pool(1)
    slot = await pool.acquire("a")
    [gone] = await _queue(pool, "b")
    gone.cancel()  # its future is cancelled now, its task's cleanup runs later
    pool.release(slot)  # no live waiter: the slot is free
    coro = pool.acquire("c")  # stepped by hand: before the cancelled task's cleanup runs
    try:
        coro.send(None)
    except StopIteration as done:  # returned at once, with the free slot
        assert done.value == slot
    else:
        coro.close()
        pytest.fail("a request waited behind a cancelled waiter with a slot free")
