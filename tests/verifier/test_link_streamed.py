"""The verifier link counts sparse steps a worker answered row by row although one
PROPOSAL fits them (``pp1q_proposals_streamed_total``): legal, but depth + 1 frames
for the verifier to check instead of one, so an operator can see a worker that never
sends PROPOSALs. Real endpoints, the frames fed in memory, their events handed to
``WorkerLink.on_events`` as the link's protocol hands them."""

from __future__ import annotations

from wire_helpers import config, step, stepped, worker_frames, worker_proposal

from pp1q.runtime.metrics import Metrics
from pp1q.verifier.link import Needs, WorkerLink
from pp1q.wire import ProposalReady

STREAMED = "pp1q_proposals_streamed_total"
DEPTH, TOP_K = 3, 2  # a sparse step one PROPOSAL answers (3 x 2 x 8 <= the test bound)


def streamed_count(answers) -> float:
    """The link's count after one step of each of ``answers`` (worker_frames: REPLYs and
    a COMPLETION; worker_proposal: one PROPOSAL), each step on a fresh pair."""
    metrics = Metrics("verifier")
    link = WorkerLink("127.0.0.1", 1, config(versions=(2,)), Needs(1, DEPTH, TOP_K),
                      metrics, 1.0, 0.2)  # never connected: fed the endpoint's events
    for answer, st in answers:
        v, w = stepped(st)
        events = v.receive_data(answer(w, st), 0.0)
        assert [type(e) for e in events] == [ProposalReady]
        link.on_events(events)
    return metrics.registry.get_sample_value(STREAMED)


def test_a_fitting_step_streamed_is_counted_its_proposal_and_dense_steps_are_not():
    fits, dense = step(depth=DEPTH, top_k=TOP_K), step(depth=DEPTH, top_k=0)
    assert streamed_count([]) == 0.0  # exported from the start
    assert streamed_count([(worker_proposal, fits), (worker_frames, dense)]) == 0.0
    assert streamed_count([(worker_frames, fits), (worker_proposal, fits),
                           (worker_frames, fits)]) == 2.0
