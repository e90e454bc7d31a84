"""At most one log line per kind of event per interval, sans-IO.

A peer or client that misbehaves on purpose makes the daemon count each event (the
counters are the record) and, without this, log each one: a flood of junk connections
wrote 9,278 lines (935 KB) in 20 s. ``LogLimit`` lets the first line of a kind through,
holds back the rest of that kind for ``interval_s``, and adds to the next line it lets
through how many it held back: "... (and 1,234 more like it in the last 10 s)". Lines
held back when no later line of their kind comes are only in the counters.

The clock is passed in (``time.monotonic`` by default), so tests step it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

# One line of a kind per this many seconds: a flood logs 6 lines a minute per kind,
# and an operator still sees a new kind of trouble at once
LOG_INTERVAL_S = 10.0
# Kinds remembered at once. Callers key by a site and a closed-set reason (Reason,
# PeerRefusal), a few hundred at most; the cap bounds a key that is not (a TLS library's
# reason string). Past it the kind let through longest ago is forgotten (its held-back
# count with it: the counters still have it).
MAX_KEYS = 1024


class LogLimit:
    """Per key, one line per ``interval_s``; the next line says how many were held."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = MAX_KEYS) -> None:
        self.interval_s, self.clock, self.max_keys = interval_s, clock, max_keys
        # key -> [when its last line was let through, lines held back since]; in the
        # order they were let through, oldest first
        self._kinds: dict[Hashable, list] = {}

    def check(self, key: Hashable) -> str | None:
        """None: hold this line back (it is counted). Otherwise let it through, with this
        suffix: "" or " (and N more like it in the last T s)"."""
        now = self.clock()
        kind = self._kinds.get(key)
        if kind is not None and now - kind[0] < self.interval_s:
            kind[1] += 1
            return None
        if kind is None and len(self._kinds) >= self.max_keys:
            del self._kinds[next(iter(self._kinds))]
        self._kinds.pop(key, None)
        self._kinds[key] = [now, 0]  # last in the order: let through most recently
        if kind is None or kind[1] == 0:
            return ""
        return f" (and {kind[1]:,} more like it in the last {now - kind[0]:.0f} s)"

    def log(self, logger: logging.Logger, level: int, key: Hashable, msg: str, *args,
            exc_info=None) -> bool:
        """``logger.log(level, msg, *args)`` unless ``key`` had a line this interval;
        True if it was let through."""
        suffix = self.check(key)
        if suffix is None:
            return False
        logger.log(level, msg + "%s", *args, suffix, exc_info=exc_info)
        return True
