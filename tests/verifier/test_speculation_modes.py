"""Explicit enablement: ``speculation`` on both daemons, every combination.

Sampled speculation runs only when both name it; a greedy verifier runs v1 sessions
with a sampled or a greedy worker; sampled offered to a worker that did not enable it
is refused at HELLO (a REFUSAL frame, counted as
``pp1q_peers_refused_total{reason="speculation_not_enabled"}`` on the worker), never
downgraded; a verifier with speculation off never dials the worker and serves every
request target-only. Each daemon exports its mode (``pp1q_speculation_info``) and the
verifier says it in its start-up log.
"""

from __future__ import annotations

import time

import pytest
from daemon_harness import Pair, value

from pp1q.tools.client import ApiError

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

MODES = ("off", "greedy", "sampled")
PROMPT = [3, 7]
SETTLE_S = 20.0  # bound on waiting for a refusal to be counted (it takes milliseconds)


def _expect(verifier: str, worker: str) -> str:
    if verifier == "off":
        return "no_link"
    if verifier == "sampled":
        return "v2" if worker == "sampled" else "refused"
    return "refused" if worker == "off" else "v1"


def _wait(check) -> bool:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("worker", MODES)
@pytest.mark.parametrize("verifier", MODES)
def test_speculation_modes(tmp_path, verifier, worker):
    expect = _expect(verifier, worker)
    pair = Pair(tmp_path, preset="close", wait=expect in ("v1", "v2"),
                verifier_args=["--speculation", verifier],
                worker_args=["--speculation", worker])
    client = pair.client()
    try:
        for role, mode in (("verifier", verifier), ("worker", worker)):
            assert value(pair.metrics(role), "pp1q_speculation_info", mode=mode) == 1
        refused = lambda: value(pair.metrics("worker"), "pp1q_peers_refused_total",  # noqa: E731
                                reason="speculation_not_enabled")
        if expect == "refused":
            assert _wait(lambda: refused() >= 1), pair.logs()
        health = client.health()
        assert health["speculation"] == verifier
        assert health["wire_version"] == {"v1": 1, "v2": 2}.get(expect)
        greedy = client.generate(PROMPT, 6, temperature=0)
        if verifier == "greedy":  # whatever the worker: sampled needs both ends' "sampled"
            with pytest.raises(ApiError) as e:
                client.generate(PROMPT, 4, seed=1)
            assert e.value.status == 422
        else:
            sampled = client.generate(PROMPT, 6, seed=1)
            assert len(sampled["token_ids"]) == 6
        v = pair.metrics("verifier")
        rounds = {k: value(v, "pp1q_rounds_total", kind=k)
                  for k in ("speculative", "greedy", "target_only", "fallback")}
        assert len(greedy["token_ids"]) == 6
        if expect == "v2":
            assert rounds["speculative"] > 0 and rounds["greedy"] > 0
        elif expect == "v1":
            assert rounds["greedy"] > 0 and rounds["speculative"] == 0
        elif expect == "refused":  # served anyway, target-only after each failed round
            assert rounds["speculative"] == rounds["greedy"] == 0 and rounds["fallback"] > 0
            # the verifier counts the worker's REFUSAL under the same reason
            assert value(v, "pp1q_validation_failures_total",
                         reason="speculation_not_enabled") >= 1
            health = client.health()
            assert health["status"] == "degraded" and health["cause"] == "session_refused"
        else:  # off: every request target-only as configured, no fallback, no connection
            assert rounds["target_only"] == 12 and rounds["fallback"] == 0
            assert health["worker"] == "disconnected" and health["status"] == "ok"
            assert health["cause"] == "speculation_off"
            assert value(v, "pp1q_reply_bytes_total") == 0  # not a byte from the worker
            assert value(pair.metrics("worker"), "pp1q_steps_total") == 0
        if expect != "refused":
            assert refused() == 0
        log = (tmp_path / "verifier.log").read_text()
        assert f"speculation {verifier}:" in log
        # the banner names the worker only where it is dialled
        assert ("no worker (speculation off)" in log) == (expect == "off"), log
    finally:
        client.close()
        pair.close()
