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
    # q rows will arrive: load the checker now. A spawned verifier rank is not told the
    # mode (it replays rank 0's ops, q rows included), so every rank of a group loads it:
    # a first op paying the load could overrun rank_timeout_s.
    if settings.speculation == "sampled" or getattr(settings, "ranks", 1) > 1:
        try:
            warm_up_checks(role)
        except ConfigError as e:
            return refuse(role, e)
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


def warm_up_checks(role: str) -> None:
    """Choose and load the q-row checker (pp1q.core.q_backend) before serving, so
    the first q row does not pay numba's import and kernel load (about 1-2 s)."""
    from pp1q.core.q_backend import warm_up

    name, why, seconds = warm_up()
    logging.getLogger(f"pp1q.{role}").info("q rows checked by %s (%s), loaded in %.2f s",
                                           name, why, seconds)


def refuse(role: str, e: Exception) -> int:
    print(f"pp1q {role}: {e}", file=sys.stderr)
    return 2
