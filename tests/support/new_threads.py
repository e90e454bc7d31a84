"""The threads started since a point of a test, by identity.

A count of the whole process (threading.active_count()) also counts the threads earlier
tests left winding down (a closed connection's handler thread, a stopped server's loop),
and one of those ending meanwhile reads as a thread the test's own code did not start
(67 against 68 under load). The threads alive now that were not alive then are the ones
started since, whatever ends meanwhile.
"""

from __future__ import annotations

import threading


class NewThreads:
    """Made before the code under test starts its threads; ``alive()`` then lists those."""

    def __init__(self) -> None:
        self.before = set(threading.enumerate())

    def alive(self, name: str | None = None) -> list[threading.Thread]:
        """The threads alive now and not at the start (named ``name`` only, if given)."""
        return [t for t in threading.enumerate()
                if t not in self.before and (name is None or t.name == name)]
