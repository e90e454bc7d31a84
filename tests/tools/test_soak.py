"""A bounded soak in CI (pp1q.tools.chaos.soak): 4 concurrent requests for 30 seconds
against real daemons with random frame and stream faults and one worker crash. No
request may fail or come back short, the wire audit must find nothing (sparse
requests' PROPOSAL frames take faults too and their commits are audited), no slot may be
held once the requests are done, and each daemon's RSS may grow by at most
RSS_GROWTH_BOUND_KIB (32 MiB) between warm-up and the end. --runslow: 5 minutes. Its
clients leave too (ABANDON_P, 0.02: test_soak_leave.py runs a quarter), and after the
load speculation must still be served (pp1q.tools.chaos.liveness).

The streamed sparse soak (vocabulary 16, top 3, 4 and 8) runs a few seconds by default
(two minutes with --runslow): its top-4 and top-8 steps are too large for one PROPOSAL,
so their sparse rows stream as REPLY frames and take the REPLY faults; the test asserts
from the wire audit that such proposals were committed, not only that the soak passed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pp1q.models.toy import ToySpec
from pp1q.tools.chaos.matrix import DEPTH
from pp1q.tools.chaos.soak import (
    DEFAULT_TOP_KS,
    DEFAULT_VOCAB,
    STREAMED_SPARSE_TOP_KS,
    STREAMED_SPARSE_VOCAB,
    SoakConfig,
    run_soak,
)
from pp1q.tools.chaos.soak_report import RSS_GROWTH_BOUND_KIB
from pp1q.wire.limits import DEFAULT_MAX_SUPPORT
from pp1q.wire.session_config import verifier_config
from pp1q.wire.sizes import proposal_fits

daemons = pytest.mark.daemons  # starts real daemon processes or servers

CI_SECONDS = 30  # a worker crash at 15 s; the default suite's share, kept small (~7 min)
SLOW_SECONDS = 300
STREAMED_CI_SECONDS = 5  # a few seconds of load: the default soak covers the rest
STREAMED_SLOW_SECONDS = 120


def _soak(tmp_path, seconds: float, crash_every_s: float):
    lines: list[str] = []
    report = run_soak(SoakConfig(seconds=seconds, crash_every_s=crash_every_s, progress_s=15),
                      tmp_path, progress=lines.append)
    print(report.format())
    assert report.problems() == [], report.format()
    assert report.requests > 0 and not report.failed
    assert report.slots_left == {"verifier": 0, "worker": 0} and report.queued_left == 0
    assert report.hung == [] and report.probe == "" and report.probe_s is not None
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


@daemons
def test_soak_thirty_seconds(tmp_path):
    _soak(tmp_path, CI_SECONDS, crash_every_s=CI_SECONDS / 2)


@daemons
@pytest.mark.slow
def test_soak_five_minutes(tmp_path):
    _soak(tmp_path, SLOW_SECONDS, crash_every_s=100)


def _fits(vocab: int, top_ks) -> dict:
    """Whether a depth-DEPTH step of each support is answered by one PROPOSAL under the
    verifier's limits at ``vocab`` (None: dense, never)."""
    limits = verifier_config(ToySpec(vocab=vocab), (2,), 4, DEPTH, DEFAULT_MAX_SUPPORT).limits
    return {k: k is not None and proposal_fits(
        SimpleNamespace(temperature=1.0, top_k=k, depth=DEPTH), limits) for k in top_ks}


def test_which_side_of_proposal_fits_each_soak_lands():
    """The default soak's sparse steps are all one PROPOSAL (so it never streams sparse
    rows); the streamed sparse soak straddles the line: top 3 (120 bytes) fits the
    128-byte frame bound at vocabulary 16, top 4 (160) and top 8 (320) stream."""
    assert _fits(DEFAULT_VOCAB, DEFAULT_TOP_KS) == {None: False, 8: True, 32: True}
    assert _fits(STREAMED_SPARSE_VOCAB, STREAMED_SPARSE_TOP_KS) == {3: True, 4: False,
                                                                    8: False}


def _streamed_soak(tmp_path, seconds: float, crash_every_s: float):
    cfg = SoakConfig(seconds=seconds, vocab=STREAMED_SPARSE_VOCAB,
                     top_ks=STREAMED_SPARSE_TOP_KS, crash_every_s=crash_every_s,
                     progress_s=max(5.0, seconds / 4))
    report = run_soak(cfg, tmp_path, progress=lambda line: None)
    print(report.format())
    assert report.problems() == [], report.format()
    assert report.slots_left == {"verifier": 0, "worker": 0}
    # the streamed path was taken: sparse proposals that came as REPLY rows were
    # committed (and each of their rows checked for q by the audit); top 3 still came
    # as one PROPOSAL
    assert report.audit_streamed_sparse_commits > 0, report.format()
    assert report.audit_proposal_commits > 0, report.format()
    # no dense step here: every REPLY that took a fault was a sparse row
    assert report.fired_on.get("REPLY", 0) > 0, report.format()
    return report


@daemons
def test_soak_streamed_sparse_rows(tmp_path):
    _streamed_soak(tmp_path, STREAMED_CI_SECONDS, crash_every_s=0)


@daemons
@pytest.mark.slow
def test_soak_streamed_sparse_rows_two_minutes(tmp_path):
    report = _streamed_soak(tmp_path, STREAMED_SLOW_SECONDS, crash_every_s=40)
    assert report.worker_restarts >= 1 and report.reconnects >= report.worker_restarts


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
