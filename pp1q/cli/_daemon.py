"""Shared start-up of the two daemons: settings, logging, event loop, signals.

A settings problem (pp1q.core.errors.ConfigError: a bad option or config key, a port in
use) ends the daemon with one line on stderr and exit status 2, whether it is found
while reading the settings or while binding; the systemd units do not restart on 2.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys


def run_daemon(args, role: str, serve) -> int:
    """Resolve settings and run ``serve(settings, stop_event)`` until SIGINT/SIGTERM."""
    from pp1q.core.errors import ConfigError
    from pp1q.runtime.config import resolve

    try:
        settings = resolve(args, role)
    except ConfigError as e:
        return refuse(role, e)
    logging.basicConfig(level=settings.log_level.upper(),
                        format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s")
    from pp1q.runtime import malloc

    tuned = malloc.tune()  # a daemon started from a shell or a unit: no page faults per row
    logging.getLogger("pp1q").debug("malloc thresholds set: %s", ", ".join(tuned) or "none")
    try:
        import uvloop
    except ImportError:  # non-Linux: the standard loop works, only slower
        uvloop = None

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await serve(settings, stop)

    try:
        if uvloop is not None:
            return int(uvloop.run(main()) or 0)
        return int(asyncio.run(main()) or 0)
    except ConfigError as e:
        return refuse(role, e)


def refuse(role: str, e: Exception) -> int:
    print(f"pp1q {role}: {e}", file=sys.stderr)
    return 2
