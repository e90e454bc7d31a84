"""A bounded soak in CI (pp1q.tools.chaos.soak): 4 concurrent requests for about half a minute
against real daemons with random frame and stream faults and one worker crash. No
request may fail or come back short, the wire audit must find nothing (sparse
requests' PROPOSAL frames take faults too and their commits are audited), no slot may be
held once the requests are done, and each daemon's RSS may grow by at most
RSS_GROWTH_BOUND_KIB (32 MiB) between warm-up and the end. --runslow: 5 minutes."""

from __future__ import annotations

import pytest

from pp1q.tools.chaos.soak import RSS_GROWTH_BOUND_KIB, SoakConfig, run_soak

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

CI_SECONDS = 30
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
    # sparse requests (top-8, top-32) are answered by one PROPOSAL a step: they took
    # faults too, and the audit checked their commits
    assert report.fired_on.get("PROPOSAL", 0) > 0 and report.audit_proposal_commits > 0
    assert report.worker_restarts >= 1 and report.reconnects >= report.worker_restarts
    verifier_rss = report.rss_kib["verifier"]
    assert verifier_rss[2] - verifier_rss[1] <= RSS_GROWTH_BOUND_KIB
    assert lines and all("requests" in line for line in lines)  # progress while running
    return report


def test_soak_half_a_minute(tmp_path):
    _soak(tmp_path, CI_SECONDS, crash_every_s=CI_SECONDS / 2)


@pytest.mark.slow
def test_soak_five_minutes(tmp_path):
    _soak(tmp_path, SLOW_SECONDS, crash_every_s=100)


class _ClosingTransport:
    """What a stream error leaves behind until connection_lost runs: closing, and a
    write raises (as uvloop's does)."""

    def is_closing(self) -> bool:
        return True

    def write(self, data) -> None:
        raise RuntimeError("unable to perform operation: the handler is closed")

    def close(self) -> None:
        pass


async def test_link_never_writes_to_a_closing_transport():
    """Regression for the bug the first 30-minute soak found: after a stream error the
    link was still ready, and a COMMIT, RESET or STEP written then failed the request
    (this test fails with RuntimeError against the link before the fix)."""
    from types import SimpleNamespace

    from pp1q.core.errors import Reason
    from pp1q.core.outcomes import FallbackCause
    from pp1q.models.toy import ToySpec
    from pp1q.runtime.metrics import Metrics
    from pp1q.verifier.link import Fallback, Needs, WorkerLink
    from pp1q.wire import Step, VerifierEndpoint, WorkerEndpoint
    from pp1q.wire.session_config import verifier_config

    config = verifier_config(ToySpec(vocab=16, seed=0), (2, 1), 4, 5, 16)
    link = WorkerLink("127.0.0.1", 1, config, Needs(4, 5, 16), Metrics("verifier"), 1.0, 0.2)
    link.endpoint = v = VerifierEndpoint(config, session=5, step_timeout=1.0)
    w = WorkerEndpoint(config)  # a live session: every send() below would produce a frame
    w.receive_data(v.hello(), 0.0)
    v.receive_data(w.data_to_send(), 0.0)
    link._proto = SimpleNamespace(transport=_ClosingTransport())
    link._ready = True  # as it stays until connection_lost
    assert link.reset(0, 1, Reason.CANCELLED) is False  # not written, no exception
    step = Step(session=5, slot=0, generation=1, round_id=1, last_committed=1, first_position=2,
                prefix_digest=0, depth=5, temperature=1.0, top_k=0, context_version=0, seed=1)
    fut = link.propose(step)
    link._flush()  # the STEP stays queued; losing the connection fails it
    assert not fut.done()
    link._go_down()
    assert fut.result() == Fallback(FallbackCause.CONNECTION_LOST, Reason.CONNECTION_LOST,
                                    "connection lost before the STEP left")
