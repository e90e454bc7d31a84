"""The verifier's request slots and the queue for them, shared fairly between clients.

A request holds one slot for its lifetime; one that finds none waits in a queue of at
most MAX_QUEUED_REQUESTS, at most ``queued_per_address`` of them from one client
address (0: any number). A freed slot goes to the waiting request whose client address
holds the fewest slots at that moment, the first come among equals: a client with a
backlog of long requests holds its slots while they run, and every other client's
request is served at the next free slot instead of behind that backlog. With one client
(or every client behind one proxy, one address) this is first come, first served.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

from pp1q.core.errors import Reason, ServiceError
from pp1q.runtime.address_counts import AddressCounts
from pp1q.runtime.metrics import Metrics
from pp1q.runtime.settings import MAX_QUEUED_REQUESTS

NO_ADDRESS = ""  # a request from no client address (an internal caller): one bucket


class SlotPool:
    """Free slot ids, who holds the others, and the requests waiting for one."""

    def __init__(self, n: int, metrics: Metrics, queued_per_address: int = 0) -> None:
        self._free = collections.deque(range(n))
        self._waiters: list[tuple[asyncio.Future, str]] = []  # in arrival order
        self._queued = AddressCounts(MAX_QUEUED_REQUESTS, queued_per_address)
        self._holder: dict[int, str] = {}  # slot -> the client address holding it
        self._held: dict[str, int] = {}  # slots by client address (holders only: bounded)
        self.metrics = metrics
        self.size = n

    async def acquire(self, address: str = NO_ADDRESS) -> int:
        # a free slot means no live waiter (release hands to those first); a waiter
        # cancelled in this tick may still be listed, and must not make this one wait
        if self._free and self._next() is None:
            slot = self._free.popleft()
            self._take(slot, address)
        else:
            full = self._queued.admit(address)
            if full == "open":
                raise ServiceError(Reason.QUEUE_FULL,
                                   f"{self._queued.max_open} requests already queued")
            if full == "address":
                raise ServiceError(Reason.TOO_MANY_QUEUED_FROM_ADDRESS,
                                   f"{self._queued.max_per_address} requests from this "
                                   f"client address already queued")
            entry = (asyncio.get_running_loop().create_future(), address)
            self._waiters.append(entry)
            self.metrics.requests_queued.set(len(self._waiters))
            try:
                slot = await entry[0]  # release() took the slot for this address
            except asyncio.CancelledError:
                if entry[0].done() and not entry[0].cancelled():
                    self.release(entry[0].result())
                raise
            finally:  # served, refused or gone: the queue is shorter by one
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._queued.release(address)
                self.metrics.requests_queued.set(len(self._waiters))
        self.metrics.slots_in_use.set(self.size - len(self._free))
        return slot

    def refuse_waiters(self, error: ServiceError) -> int:
        """Every request waiting for a slot fails with ``error``; how many there were."""
        waiting, self._waiters = self._waiters, []
        n = 0
        for fut, _ in waiting:
            if not fut.done():
                fut.set_exception(error)
                n += 1
        return n

    def release(self, slot: int) -> None:
        address = self._holder.pop(slot)
        left = self._held[address] - 1
        if left:
            self._held[address] = left
        else:
            del self._held[address]
        entry = self._next()
        if entry is not None:
            self._waiters.remove(entry)
            self._take(slot, entry[1])
            entry[0].set_result(slot)
            return
        self._free.append(slot)
        self.metrics.slots_in_use.set(self.size - len(self._free))

    def _next(self) -> tuple[asyncio.Future, str] | None:
        """The waiting request whose address holds the fewest slots; the first among
        equals (min keeps the first of equal keys)."""
        live = [e for e in self._waiters if not e[0].done()]
        return min(live, key=lambda e: self._held.get(e[1], 0)) if live else None

    def _take(self, slot: int, address: str) -> None:
        self._holder[slot] = address
        self._held[address] = self._held.get(address, 0) + 1
