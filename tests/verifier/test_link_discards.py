"""The verifier link counts each frame its endpoint discards unread under the reason the
endpoint gave (``pp1q_late_replies_discarded_total{reason}``): a PROPOSAL delivered twice
as ``duplicate_round``, a replay once its generation is dead as ``stale_generation``, so
an operator (and the chaos matrix's sparse rows) can tell the two apart. Real endpoints,
the frames fed in memory, their events handed to ``WorkerLink.on_events`` as the link's
protocol hands them; the planted variants (one reason for every frame, in the metrics
the daemon passes the link, or in the events the endpoint returns) must be caught."""

from __future__ import annotations

import dataclasses

import pytest
from wire_helpers import SESSION, config, pair, rows_for, step

from pp1q.core.errors import Reason
from pp1q.runtime.metrics import Metrics
from pp1q.verifier.link import Needs, WorkerLink
from pp1q.wire import Discarded, ProposalReady, Reset, VerifierEndpoint
from pp1q.wire.events import DISCARD_REASONS

LATE = "pp1q_late_replies_discarded_total"
DEPTH, TOP_K = 3, 2  # a sparse step answered by one PROPOSAL (3 x 2 x 8 <= the test bound)


def counts(metrics: Metrics) -> dict[str, float | None]:
    return {r.value: metrics.registry.get_sample_value(LATE, {"reason": r.value})
            for r in DISCARD_REASONS}


def discards(metrics: Metrics, verifier: type[VerifierEndpoint] = VerifierEndpoint) -> dict:
    """One PROPOSAL delivered twice (the copy after the original made the slot READY),
    then once more after a RESET killed its generation; the link's counts by reason."""
    link = WorkerLink("127.0.0.1", 1, config(versions=(2,)), Needs(1, DEPTH, TOP_K),
                      metrics, 1.0, 0.2)  # never connected: fed the endpoint's events
    v, w = pair(verifier=verifier)
    st = step(depth=DEPTH, top_k=TOP_K)
    w.receive_data(v.send(st, now=0.0), 0.0)
    drawn = rows_for(st)
    frame = w.send_proposal(st, [t for t, _, _ in drawn], [r for _, r, _ in drawn])
    ready, copy = v.receive_data(frame + frame, 0.0)
    assert isinstance(ready, ProposalReady) and isinstance(copy, Discarded)
    link.on_events([ready, copy])
    v.send(Reset(session=SESSION, slot=0, generation=1, reason=Reason.CANCELLED))
    replay = v.receive_data(frame, 0.0)
    assert [type(e) for e in replay] == [Discarded]
    link.on_events(replay)
    return counts(metrics)


def test_every_reason_is_exported_at_zero_from_the_start():
    assert counts(Metrics("verifier")) == {"stale_generation": 0.0, "duplicate_round": 0.0}


def test_a_duplicate_and_a_stale_replay_count_under_their_own_reasons():
    assert discards(Metrics("verifier")) == {"duplicate_round": 1.0, "stale_generation": 1.0}


class OneReasonMetrics(Metrics):
    """Planted: every discarded frame counted as a duplicate, whatever its reason."""

    def late_reply(self, reason: Reason) -> None:
        super().late_reply(Reason.DUPLICATE_ROUND)


class AllStaleEndpoint(VerifierEndpoint):
    """Planted: the endpoint says stale_generation for every frame it discards."""

    def receive_data(self, data, now):
        return [dataclasses.replace(e, reason=Reason.STALE_GENERATION)
                if isinstance(e, Discarded) else e for e in super().receive_data(data, now)]


@pytest.mark.parametrize("metrics, verifier", [(OneReasonMetrics, VerifierEndpoint),
                                               (Metrics, AllStaleEndpoint)])
def test_one_reason_for_every_discard_is_caught(metrics, verifier):
    got = discards(metrics("verifier"), verifier)
    assert sum(got.values()) == 2  # both frames still counted: only the reason is wrong
    assert got != {"duplicate_round": 1.0, "stale_generation": 1.0}
