"""The matrix row "verifier rank crash", on its own pair: a verifier of two ranks.

The ranks' failure rule (docs/operations.md, "Ranks") is fail-stop: when a rank dies,
every open request fails with HTTP 503 ``ranks_lost`` (nothing of it is committed
anywhere), ``pp1q_rank_failures_total{cause="rank_lost"}`` counts it, and every
surviving rank exits with status 3 for its supervisor to restart the group. So this row
checks, around one SIGKILL of rank 1 while four requests are open:

- every request either completed with all its tokens or failed with 503 ranks_lost
  (at least one was open, and none came back short);
- rank_lost = 1 = the crashes injected; rank 0 exits with status 3;
- the wire audit finds no violation (zero partial commits, no id without q);
- after the restart (this module plays the supervisor) four more requests complete
  and speculation resumes.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import time
from pathlib import Path

from pp1q.tools.chaos.matrix import PROMPT, WATCHDOG_MS, RowResult
from pp1q.tools.chaos.rig import Rig, child_pids, value
from pp1q.tools.client import ApiError

NAME = "verifier rank crash"
RANK_ARGS = ("--ranks", "2", "--target-delay-ms", "20", "--rank-exit-grace-s", "2")
WAVE = 4
TOKENS = 64  # long enough (about 1 s) that requests are open when the rank dies
EXIT_RANKS_LOST = 3  # pp1q.verifier.ranks.group.EXIT_RANKS_LOST (not imported: torch-free here)
WAIT_S = 30.0  # bound on each wait below


def _wave(rig: Rig, seeds: range) -> list[dict | ApiError]:
    def one(seed: int):
        client = rig.client()
        try:
            return client.generate(PROMPT, TOKENS, seed=seed)
        except ApiError as e:
            return e
        finally:
            client.close()
    with cf.ThreadPoolExecutor(WAVE) as pool:
        return list(pool.map(one, seeds))


def run_rank_crash(log_dir: str | Path) -> RowResult:
    row = RowResult(NAME, 'rank_failures{rank_lost}, exit 3')
    rig = Rig(log_dir, vocab=16, preset="far", watchdog_ms=WATCHDOG_MS,
              verifier_args=RANK_ARGS)
    try:
        with cf.ThreadPoolExecutor(1) as bg:
            crash_wave = bg.submit(_wave, rig, range(1, WAVE + 1))
            deadline = time.monotonic() + WAIT_S
            while value(rig.metrics("verifier"), "pp1q_slots_in_use") < WAVE and \
                    time.monotonic() < deadline:
                time.sleep(0.02)
            ranks = child_pids(rig.verifier.proc.pid)
            if not ranks:
                row.problems.append("rank 0 has no spawned rank to kill")
                return row
            os.kill(ranks[0], signal.SIGKILL)
            row.injected = 1
            first = crash_wave.result(WAIT_S * 2)
        lost = value(rig.metrics("verifier"), "pp1q_rank_failures_total", cause="rank_lost")
        status = rig.verifier.proc.wait(WAIT_S)
        rig.restart_verifier()  # the supervisor's move
        second = _wave(rig, range(WAVE + 1, 2 * WAVE + 1))
        answers = [a for a in first + second if isinstance(a, dict)]
        errors = [e for e in first + second if isinstance(e, ApiError)]
        row.requests = 2 * WAVE
        row.complete = sum(len(a["token_ids"]) == TOKENS for a in answers)
        row.observed = f"{int(lost)}, exit {status}; {len(errors)} open requests 503"
        for a in answers:
            for cause, n in a["stats"]["fallbacks"].items():
                if n:
                    row.fallbacks[cause] = row.fallbacks.get(cause, 0) + n
        p = row.problems
        if lost != row.injected:
            p.append(f"rank_failures{{rank_lost}} = {lost}, want {row.injected}")
        if status != EXIT_RANKS_LOST:
            p.append(f"rank 0 exited with {status}, want {EXIT_RANKS_LOST}")
        if not errors or any((e.status, e.code) != (503, "ranks_lost") for e in errors):
            p.append(f"open requests: {[str(e) for e in errors][:3] or 'none failed'}")
        if errors and any(isinstance(a, ApiError) for a in second):
            p.append("requests failed after the restart")
        if row.complete != len(answers):
            p.append("an answer came back short")
        if not any(a["stats"]["rounds"] for a in second if isinstance(a, dict)):
            p.append("no speculation after the restart")
        audit = rig.audit
        row.audit = f"{audit.commits} commits, {len(audit.violations)} violations"
        p += audit.violations[:3]
    finally:
        rig.close()
    return row
