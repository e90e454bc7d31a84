"""SIGTERM stops the daemons gracefully (real processes): the verifier accepts no new
connection, answers the queued request 503 ``stopping`` with the reason in its body, lets
the request in flight finish within drain_timeout_s (or cuts it at its next round after
the deadline, 503 ``stopping``), logs and counts what it did and exits 0; the worker
closes its connections with a log line and exits 0."""

from __future__ import annotations

import concurrent.futures as cf
import signal
import time

import pytest
from daemon_harness import Pair, value

from pp1q.tools.client import ApiError

pytestmark = pytest.mark.daemons

WAIT_S = 60.0  # every wait below is bounded by this; the toy rounds take milliseconds
EXIT_S = 60.0


def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _outcome(fut: cf.Future):
    try:
        return fut.result(WAIT_S)
    except ApiError as e:
        return e


def _one_in_flight_one_queued(pair: Pair, pool: cf.ThreadPoolExecutor, max_tokens: int):
    """A request holding the only slot and one waiting for it, both seen in the metrics."""
    first = pool.submit(pair.client().generate, [1, 2], max_tokens, seed=1)
    _until(lambda: value(pair.metrics("verifier"), "pp1q_slots_in_use") == 1, "no slot taken")
    queued = pool.submit(pair.client().generate, [3, 4], 4, seed=2)
    _until(lambda: value(pair.metrics("verifier"), "pp1q_requests_queued") == 1, "none queued")
    return first, queued


def _stop_and_read(pair: Pair) -> str:
    pair.verifier.proc.send_signal(signal.SIGTERM)
    assert pair.verifier.proc.wait(EXIT_S) == 0
    return (pair.tmp / "verifier.log").read_text()


@pytest.mark.parametrize("case", ["drained", "cut"])
def test_sigterm_drains_in_flight_refuses_queued_and_logs_it(tmp_path, case):
    # each target step takes 20 ms, so a request is still running when SIGTERM arrives;
    # "cut": the deadline (0.2 s) passes long before its 4096 tokens are done
    drain = {"drained": "60", "cut": "0.2"}[case]
    max_tokens = {"drained": 40, "cut": 4096}[case]
    pair = Pair(tmp_path, verifier_args=["--slots", "1", "--target-delay-ms", "20",
                                         "--drain-timeout-s", drain])
    try:
        with cf.ThreadPoolExecutor(2) as pool:
            first, queued = _one_in_flight_one_queued(pair, pool, max_tokens)
            log = _stop_and_read(pair)
            got_first, got_queued = _outcome(first), _outcome(queued)
        assert isinstance(got_queued, ApiError) and got_queued.status == 503
        assert got_queued.code == "stopping" and "stopping" in str(got_queued)
        if case == "drained":
            assert len(got_first["token_ids"]) == max_tokens  # finished, whole
            assert "stopped: 1 in-flight requests finished, 0 cut" in log
        else:
            assert isinstance(got_first, ApiError) and got_first.status == 503
            assert got_first.code == "stopping"
            assert "stopped: 0 in-flight requests finished, 1 cut" in log
        assert "1 queued answered 503 stopping" in log
        assert "stopping: accepting no new connections" in log
        with pytest.raises(ApiError):  # nothing listens any more
            pair.client().health()
    finally:
        pair.close()


def test_a_draining_verifier_says_stopping_and_counts_the_refusals(tmp_path):
    pair = Pair(tmp_path, verifier_args=["--slots", "1", "--target-delay-ms", "20",
                                         "--drain-timeout-s", "60"])
    try:
        with cf.ThreadPoolExecutor(2) as pool:
            first, queued = _one_in_flight_one_queued(pair, pool, 400)
            keep = pair.client()
            assert keep.health()["status"] == "ok"  # the connection stays open (keep-alive)
            pair.verifier.proc.send_signal(signal.SIGTERM)
            _until(lambda: queued.done(), "the queued request was not answered")
            with pytest.raises(ApiError) as e:  # an open connection, a new request: 503
                keep.health()
            assert e.value.status == 503
            m = pair.metrics("verifier")  # /metrics stays up while draining
            assert value(m, "pp1q_requests_refused_total", reason="stopping") == 1
            assert value(m, "pp1q_requests_queued") == 0
            assert pair.verifier.proc.wait(EXIT_S) == 0
            assert len(first.result(WAIT_S)["token_ids"]) == 400
    finally:
        pair.close()


def test_the_worker_stops_on_sigterm_closing_its_connections(tmp_path):
    pair = Pair(tmp_path)
    try:
        pair.worker.proc.send_signal(signal.SIGTERM)
        assert pair.worker.proc.wait(EXIT_S) == 0
        log = (tmp_path / "worker0.log").read_text()
        assert "stopping: listening no more; closed 1 verifier connection(s)" in log
    finally:
        pair.close()
