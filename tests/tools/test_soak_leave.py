"""Clients that leave, in the soak (pp1q.tools.chaos.leave, load, liveness): a few
seconds of soak where a quarter of the requests' clients close their connection at a
random moment, plain or streamed, speculative or target-only. Every request read to its
end must complete (none hung), speculation must still work afterwards (a speculative
round counted once the load stopped), no slot held and no request queued.

It caught the bug helper-82 found fuzzing (51707f2): a request cancelled mid-round kept
its STEP's place in one of the link's two in-flight batches for ever; two such and no
STEP left the verifier again, so every speculative request hung."""

from __future__ import annotations

import random

import pytest

from pp1q.tools.chaos import leave
from pp1q.tools.chaos.liveness import LEAVING_CLIENTS
from pp1q.tools.chaos.soak import SoakConfig, run_soak

daemons = pytest.mark.daemons  # starts real daemon processes or servers

SECONDS = 6  # enough leaving clients (about 15) to catch a place held by each
ABANDON_P = 0.25
HANG_S = 10.0  # no crash here: a request of the mix takes well under a second or two
TARGET_DELAY_MS = 5.0


@daemons
def test_soak_with_clients_that_leave(tmp_path):
    cfg = SoakConfig(seconds=SECONDS, crash_every_s=0, abandon_p=ABANDON_P, hang_s=HANG_S,
                     target_delay_ms=TARGET_DELAY_MS,
                     progress_s=SECONDS)
    report = run_soak(cfg, tmp_path, progress=lambda line: None)
    print(report.format())
    assert report.problems() == [], report.format()
    assert report.hung == [] and report.probe == "" and report.probe_s is not None
    # clients left at several stages, speculative requests among them
    assert sum(report.left.get(s, 0) for s in leave.STAGES) >= 5, report.format()
    assert report.left.get("mid_stream", 0) and report.left.get("before_answer", 0), \
        report.format()
    assert report.left_speculative > 0, report.format()
    # the verifier saw clients go: their requests ended early (cancelled), no more of
    # them than left, and the ones left one by one after the load among them
    left = sum(report.left.get(s, 0) for s in leave.STAGES)
    after = sum(report.left_after.values())
    assert after == LEAVING_CLIENTS and report.left_after.get("mid_stream") == after
    assert after <= report.ended_early <= left + after, report.format()
    assert report.slots_left == {"verifier": 0, "worker": 0} and report.queued_left == 0
    assert report.requests > 0 and report.verified_rounds > 0


def test_leaving_is_drawn_in_its_own_domain():
    """p 0 draws nothing (the request mix of a soak that leaves nothing is unchanged);
    p 1 always leaves, with both kinds of each choice among a few draws."""
    rng = random.Random(0)
    assert all(leave.draw(rng, 0.0) is None for _ in range(100))
    plans = [leave.draw(rng, 1.0) for _ in range(64)]
    assert all(p is not None for p in plans)
    assert {p.streamed for p in plans} == {True, False}
    assert {p.speculative for p in plans} == {True, False}
    assert {p.events for p in plans} == set(range(leave.LEAVE_EVENTS_MAX + 1))


def test_a_streamed_request_body_carries_a_64_bit_seed_as_int64():
    plan = leave.Plan(streamed=True, speculative=False, wait_s=0.0, events=1)
    path, body = leave.body_of(plan, [1, 2], 4, (1 << 64) - 1, 8)
    assert path == "/v1/completions" and body["seed"] == -1
    assert body["pp1q"] == {"speculative": False, "draft_top_k": 8}
    plain = leave.Plan(streamed=False, speculative=True, wait_s=0.0, events=0)
    path, body = leave.body_of(plain, [1, 2], 4, 5, None)
    assert path == "/v1/generate" and body["seed"] == 5 and "top_k" not in body
