"""The STEP watchdog: one loop timer armed at the endpoint's earliest STEP deadline.

The sans-IO endpoint owns the deadlines (``send(STEP, now)`` sets now + step_timeout);
this timer only makes sure ``check_timeouts(now)`` runs when the earliest one passes,
and re-arms after every STEP sent and every batch of events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pp1q.wire import VerifierEndpoint
from pp1q.wire.events import ProposalFailed


class Watchdog:
    def __init__(self, on_timeout: Callable[[list[ProposalFailed]], None]) -> None:
        self._on_timeout = on_timeout
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None
        self._endpoint: VerifierEndpoint | None = None

    def attach(self, endpoint: VerifierEndpoint | None) -> None:
        self.cancel()
        self._endpoint = endpoint

    def arm(self) -> None:
        """Point the timer at the endpoint's earliest deadline (or stop it)."""
        ep = self._endpoint
        deadline = ep.next_deadline() if ep is not None else None
        if deadline == self._armed_at:
            return
        self.cancel()
        if deadline is not None:
            loop = asyncio.get_running_loop()
            self._handle = loop.call_at(deadline, self._fire)
            self._armed_at = deadline

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._armed_at = None

    def _fire(self) -> None:
        self._handle = self._armed_at = None
        ep = self._endpoint
        if ep is None:
            return
        failed = ep.check_timeouts(asyncio.get_running_loop().time())
        if failed:
            self._on_timeout(failed)
        self.arm()
