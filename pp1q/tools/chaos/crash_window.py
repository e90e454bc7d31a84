"""The soak's deliberate worker crashes, and the reads of the worker that race one.

The soak's chaos thread kills the worker (SIGKILL) and starts a new one on the same port
while the soak samples the worker's /metrics every quarter second. A scrape under way at
the kill is cut: a body short of its Content-Length (http.client.IncompleteRead, which
is not an OSError), a reset, a refused connection until the new worker listens; a read
of the killed worker's RSS finds no process. That is the crash the soak made, not a
failure of the worker's metrics. ``CrashWindow.read`` tells the two apart: a read that
failed while a crash was under way (begun before the read ended, not over when it
began) is counted in ``raced`` and comes back as None; any other failure is raised.
"""

from __future__ import annotations

import contextlib
import http.client
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

SCRAPE_ERRORS = (OSError, http.client.HTTPException)  # urllib's errors are OSErrors
RSS_ERRORS = (OSError, RuntimeError)  # /proc/PID gone (reaped), or no VmRSS (a zombie)


class CrashWindow:
    """Crashes begun and over, counted by the chaos thread; the reads they cut, by the
    reading thread. Each count has one writer, and a read compares counts taken before
    and after it, so no lock is needed."""

    def __init__(self) -> None:
        self.begun = 0  # before the kill
        self.over = 0  # once the new worker is started
        self.raced = 0  # reads of the worker that a crash cut

    @contextlib.contextmanager
    def crash(self) -> Iterator[None]:
        """Around a kill and the restart after it. A restart that fails leaves the crash
        under way (its reads of the worker still counted, not raised): the failure is
        the chaos thread's to report (``run_soak`` raises ``ChaosError``), not a refused
        scrape's."""
        self.begun += 1
        yield
        self.over += 1

    def read(self, fn: Callable[[], T], errors: tuple[type[BaseException], ...] = SCRAPE_ERRORS
             ) -> T | None:
        """``fn()``; None where it raised one of ``errors`` while a crash was under way
        (counted in ``raced``). Raised where no crash overlapped it."""
        begun, over = self.begun, self.over
        try:
            return fn()
        except errors:
            if begun == over and self.begun == begun:
                raise
            self.raced += 1
            return None
