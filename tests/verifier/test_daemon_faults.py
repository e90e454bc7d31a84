"""Faults between real daemons: every request completes, the right fallback happens once,
and the counters say so. pp1q.tools.chaos's proxy (``Pair(rules=...)``) sits between verifier
and worker and injects one fault on the worker -> verifier stream."""

from __future__ import annotations

import threading
import time

import pytest
from daemon_harness import Pair, fallbacks_of, one_request, value, wait_fired

from pp1q.tools.chaos.faults import BitFlip, Delay, Drop, Rule
from pp1q.wire import MsgType

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

POLL_S = 0.05  # metric polling step; bounded by WAIT_S
WAIT_S = 20.0  # upper bound for an asynchronous counter to reach its value


def _wait_metric(pair: Pair, role: str, name: str, at_least: float, **labels) -> float:
    deadline = time.monotonic() + WAIT_S
    while True:
        v = value(pair.metrics(role), name, **labels)
        if v >= at_least or time.monotonic() > deadline:
            return v
        time.sleep(POLL_S)


def test_reply_late_past_the_watchdog(tmp_path):
    fault = Rule(Delay(1.5), msg_type=MsgType.COMPLETION)  # the first COMPLETION, late
    pair = Pair(tmp_path, preset="close", rules=[fault],
                verifier_args=["--watchdog-ms", "500"])
    try:
        answer = one_request(pair)
        assert len(answer["token_ids"]) == 12
        assert fallbacks_of(answer) == {"watchdog_timeout": 1}
        assert answer["stats"]["target_only_steps"] == 1
        late = _wait_metric(pair, "verifier", "pp1q_late_replies_discarded_total", 1,
                            reason="stale_generation")
        m = pair.metrics("verifier")
        assert value(m, "pp1q_watchdog_timeouts_total") == 1
        assert value(m, "pp1q_fallbacks_total", cause="watchdog_timeout") == 1
        assert value(m, "pp1q_generation_invalidations_total") == 1
        assert value(m, "pp1q_rounds_total", kind="fallback") == 1
        assert late == 1  # the delayed COMPLETION, discarded unread: its generation died
        assert value(m, "pp1q_late_replies_discarded_total", reason="duplicate_round") == 0
        assert value(pair.metrics("worker"), "pp1q_generation_invalidations_total") == 1
    finally:
        pair.close()


def test_one_corrupt_byte_discards_the_proposal(tmp_path):
    fault = Rule(BitFlip("payload", offset=0, bit=0), msg_type=MsgType.REPLY)  # first REPLY
    pair = Pair(tmp_path, preset="close", rules=[fault])
    try:
        answer = one_request(pair)
        assert len(answer["token_ids"]) == 12
        assert fault.fired == 1
        assert fallbacks_of(answer) == {"invalid_reply": 1}
        m = pair.metrics("verifier")
        assert value(m, "pp1q_validation_failures_total", reason="checksum_mismatch") == 1
        assert value(m, "pp1q_fallbacks_total", cause="invalid_reply") == 1
        assert value(m, "pp1q_generation_invalidations_total") == 1
        assert value(m, "pp1q_reconnects_total") == 0  # a bad payload poisons one proposal
        # frames of the dead generation that were already in flight: at most the rest
        assert value(m, "pp1q_late_replies_discarded_total", reason="stale_generation") <= 5
        assert value(m, "pp1q_late_replies_discarded_total", reason="duplicate_round") == 0
        # and the session goes on speculating
        assert answer["stats"]["rounds"] >= 1
    finally:
        pair.close()


def test_worker_killed_mid_round_then_restarted(tmp_path):
    fault = Rule(Drop(), msg_type=MsgType.COMPLETION)  # the first COMPLETION never arrives
    pair = Pair(tmp_path, preset="close", rules=[fault],
                verifier_args=["--watchdog-ms", "10000"])
    try:
        box: dict = {}
        t = threading.Thread(target=lambda: box.update(answer=one_request(pair, max_tokens=10)))
        t.start()
        assert wait_fired(fault, WAIT_S), pair.logs()
        port = pair.worker.port
        pair.worker.kill()  # the STEP's COMPLETION was lost in the proxy: mid-round
        t.join(WAIT_S * 2)
        answer = box["answer"]
        assert len(answer["token_ids"]) == 10
        falls = fallbacks_of(answer)
        assert falls.pop("connection_lost") == 1
        assert set(falls) <= {"worker_unavailable"}  # the rest ran target-only
        assert answer["stats"]["rounds"] == 0
        m = pair.metrics("verifier")
        assert value(m, "pp1q_fallbacks_total", cause="connection_lost") == 1
        assert value(m, "pp1q_watchdog_timeouts_total") == 0
        # a new worker on the same port: the verifier reconnects with a new session
        pair.worker = pair.start_worker(f"127.0.0.1:{port}")
        pair.client().wait_connected(WAIT_S)
        assert _wait_metric(pair, "verifier", "pp1q_reconnects_total", 1) == 1
        again = one_request(pair, max_tokens=10, seed=2)
        assert again["stats"]["rounds"] >= 1 and not fallbacks_of(again)
    finally:
        pair.close()


def test_mismatched_model_seed_is_refused_at_hello(tmp_path):
    pair = Pair(tmp_path, model_seed=1, wait=False)  # worker seed 1, verifier seed 0
    try:
        assert _wait_metric(pair, "verifier", "pp1q_validation_failures_total", 1,
                            reason="wrong_identity") >= 1
        answer = one_request(pair, max_tokens=4)
        assert len(answer["token_ids"]) == 4
        assert fallbacks_of(answer) == {"worker_unavailable": 4}
        health = pair.client().health()  # served (200), but not speculating: degraded
        assert health["worker"] == "disconnected" and health["status"] == "degraded"
        assert (health["cause"], health["detail"]) == ("session_refused", "wrong_identity")
        w = pair.metrics("worker")
        assert value(w, "pp1q_validation_failures_total", reason="wrong_identity") >= 1
        assert value(w, "pp1q_steps_total") == 0
    finally:
        pair.close()
    # each log says which values differ, not only which fields (was: "mismatched
    # draft_id, target_id" on both sides, and nothing to compare)
    logs = {p.name: p.read_text() for p in tmp_path.glob("*.log")}
    toy = "toy-target-v1:vocab=16:seed="
    assert f"target_id: here '{toy}0')" in logs["verifier.log"]
    assert f"target_id: here '{toy}1', the peer's '{toy}0'" in logs["worker0.log"]
