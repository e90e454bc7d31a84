"""Load the q-row checker (pp1q.core.q_backend) before a daemon serves.

Both daemons' ``serve`` call ``warm_up_checks`` first, so neither the first q row nor
a test that runs a daemon in-process pays numba's import and the kernels' load (1-2 s;
on a loaded machine long enough to overrun the STEP watchdog). A bad ``PP1Q_VALIDATE``
raises ConfigError here: the daemon refuses to start with one line and status 2.
"""

from __future__ import annotations

import logging

from pp1q.core.q_backend import warm_up


def warm_up_checks(settings, role: str) -> None:
    """Only where q rows can arrive: sampled speculation, or any rank of a verifier
    group (a spawned rank is not told the mode; it replays rank 0's ops, q rows
    included, and a first op paying the load could overrun rank_timeout_s)."""
    if settings.speculation != "sampled" and getattr(settings, "ranks", 1) <= 1:
        return
    name, why, seconds = warm_up()
    logging.getLogger(f"pp1q.{role}").info("q rows checked by %s (%s), loaded in %.2f s",
                                           name, why, seconds)
