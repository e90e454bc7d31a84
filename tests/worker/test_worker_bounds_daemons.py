"""The worker's idle deadline against a real verifier (two processes): a verifier with no
request yet loses its pending session to ``idle_timeout_s``, reconnects, and its next
request is speculative (docs/operations.md, "Bounds on the worker")."""

from __future__ import annotations

import time

import pytest
from daemon_harness import Pair, one_request, value

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

IDLE_S = 2.0
WAIT_S = 30.0  # bounded wait for the worker's close and the verifier's reconnect


def test_an_idle_verifier_reconnects_after_its_session_expires(tmp_path):
    pair = Pair(tmp_path, worker_args=["--idle-timeout-s", str(IDLE_S)])
    try:
        deadline = time.monotonic() + WAIT_S
        while value(pair.metrics("verifier"), "pp1q_reconnects_total") < 1:
            assert time.monotonic() < deadline, "the verifier never reconnected"
            time.sleep(0.1)
        assert value(pair.metrics("worker"), "pp1q_connections_closed_total",
                     reason="idle_timeout") >= 1
        pair.client().wait_connected(WAIT_S)
        one_request(pair, max_tokens=8)
        # speculation runs again (a token could still fall back if its STEP met an expiry
        # at that very moment: not asserted, the rounds are)
        assert value(pair.metrics("verifier"), "pp1q_rounds_total", kind="speculative") > 0
    finally:
        pair.close()
