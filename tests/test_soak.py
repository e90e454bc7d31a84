"""A bounded soak in CI (pp1q.chaos.soak): 4 concurrent requests for about a minute
against real daemons with random frame and stream faults and one worker crash. No
request may fail or come back short, the wire audit must find nothing, no slot may be
held once the requests are done, and each daemon's RSS may grow by at most
RSS_GROWTH_BOUND_KIB (32 MiB) between warm-up and the end. --runslow: 5 minutes."""

from __future__ import annotations

import pytest

from pp1q.chaos.soak import RSS_GROWTH_BOUND_KIB, SoakConfig, run_soak

CI_SECONDS = 60
SLOW_SECONDS = 300


def _soak(tmp_path, seconds: float, crash_every_s: float):
    lines: list[str] = []
    report = run_soak(SoakConfig(seconds=seconds, crash_every_s=crash_every_s, progress_s=15),
                      tmp_path, progress=lines.append)
    print(report.format())
    assert report.problems() == [], report.format()
    assert report.requests > 0 and not report.failed
    assert report.slots_left == {"verifier": 0, "worker": 0}
    assert report.slots_hwm["verifier"] <= 4  # four requests in flight, four slots
    assert report.audit_commits > 0 and report.audit_violations == []
    assert sum(report.fallbacks.values()) > 0  # the faults really fell back
    assert len(report.injections) >= 5  # several fault kinds were exercised
    assert report.worker_restarts >= 1 and report.reconnects >= report.worker_restarts
    verifier_rss = report.rss_kib["verifier"]
    assert verifier_rss[2] - verifier_rss[1] <= RSS_GROWTH_BOUND_KIB
    assert lines and all("requests" in line for line in lines)  # progress while running
    return report


def test_soak_one_minute(tmp_path):
    _soak(tmp_path, CI_SECONDS, crash_every_s=CI_SECONDS / 2)


@pytest.mark.slow
def test_soak_five_minutes(tmp_path):
    _soak(tmp_path, SLOW_SECONDS, crash_every_s=100)
