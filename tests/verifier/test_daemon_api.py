"""The daemons' HTTP API, /metrics and v1 greedy sessions, as real processes."""

from __future__ import annotations

import pytest
from daemon_harness import Pair, value

from pp1q.tools.client import ApiError

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

PROMPT = [3, 7]
K = 8  # requests in the metrics run
MAX_TOKENS = 10


def test_metrics_counters_equal_the_events(tmp_path):
    pair = Pair(tmp_path, preset="close")
    try:
        bodies = [{"prompt": PROMPT, "max_tokens": MAX_TOKENS, "seed": i} for i in range(K)]
        bodies.append({"prompt": PROMPT, "max_tokens": 3, "seed": 99, "speculative": False})
        answers = pair.generate_many(bodies)
        v, w = pair.metrics("verifier"), pair.metrics("worker")  # scraped over HTTP
    finally:
        pair.close()
    stats = [a["stats"] for a in answers]
    rounds = sum(s["rounds"] for s in stats)
    accepted = sum(s["accepted"] for s in stats)
    target_only = sum(s["target_only_steps"] for s in stats)
    assert rounds > 0 and target_only == 3
    assert value(v, "pp1q_rounds_total", kind="speculative") == rounds
    assert value(v, "pp1q_rounds_total", kind="target_only") == target_only
    assert value(v, "pp1q_rounds_total", kind="fallback") == 0
    assert value(v, "pp1q_drafted_tokens_total") == sum(s["drafted"] for s in stats)
    assert value(v, "pp1q_accepted_tokens_total") == accepted
    assert value(v, "pp1q_accepted_length_count") == rounds
    assert value(v, "pp1q_accepted_length_sum") == accepted
    assert value(v, "pp1q_round_latency_seconds_count") == rounds
    # every committed token: accepted drafts + one correction/bonus per round + target-only
    assert value(v, "pp1q_generated_tokens_total") == accepted + rounds + target_only
    assert value(v, "pp1q_requests_total", outcome="ok") == K + 1
    assert value(v, "pp1q_slots_in_use") == 0
    for cause in ("watchdog_timeout", "invalid_reply", "connection_lost", "worker_unavailable",
                  "worker_refused"):
        assert value(v, "pp1q_fallbacks_total", cause=cause) == 0
    assert value(v, "pp1q_generation_invalidations_total") == 0
    for reason in ("stale_generation", "duplicate_round"):  # each exported, at zero
        assert ("pp1q_late_replies_discarded_total", (("reason", reason),)) in v
        assert value(v, "pp1q_late_replies_discarded_total", reason=reason) == 0
    assert value(v, "pp1q_reconnects_total") == 0
    # the worker saw the same rounds and sent exactly the bytes the verifier received
    assert value(w, "pp1q_steps_total") == rounds
    assert value(w, "pp1q_round_latency_seconds_count") == rounds
    assert value(w, "pp1q_reply_bytes_total") == value(v, "pp1q_reply_bytes_total") > 0
    assert value(w, "pp1q_generation_invalidations_total") == 0
    assert value(v, "pp1q_build_info", role="verifier", version="0.1.0",
                 target="toy-target-v1:vocab=16:seed=0",
                 draft="toy-dspark-v1:vocab=16:seed=0", wire_versions="2") == 1
    assert value(v, "pp1q_speculation_info", mode="sampled") == 1


def test_v1_session_serves_greedy_and_refuses_sampled(tmp_path):
    pair = Pair(tmp_path, preset="close", verifier_args=["--speculation", "greedy"])
    client = pair.client()
    try:
        assert client.health()["wire_version"] == 1
        spec = client.generate(PROMPT, 12, temperature=0)
        base = client.generate(PROMPT, 12, temperature=0, speculative=False)
        with pytest.raises(ApiError) as e:
            client.generate(PROMPT, 4, seed=1)
        target_only_sampled = client.generate(PROMPT, 4, seed=1, speculative=False)
        v = pair.metrics("verifier")
    finally:
        client.close()
        pair.close()
    assert spec["token_ids"] == base["token_ids"]  # greedy is deterministic: equal outputs
    assert spec["stats"]["rounds"] >= 1 and spec["stats"]["accepted"] >= 1
    assert value(v, "pp1q_rounds_total", kind="greedy") == spec["stats"]["rounds"]
    assert (e.value.status, e.value.code) == (422, "sampled_on_v1")
    assert len(target_only_sampled["token_ids"]) == 4


def test_api_errors_and_health(tmp_path):
    pair = Pair(tmp_path)
    client = pair.client()
    try:
        health = client.health()
        assert health["status"] == "ok" and health["worker"] == "connected"
        for body, code in [({"prompt_token_ids": [16], "max_tokens": 2}, "token_out_of_vocab"),
                           ({"prompt_token_ids": [1]}, "invalid_field"),
                           ({"prompt_token_ids": [1], "max_tokens": 2, "top_k": 0},
                            "invalid_field")]:
            with pytest.raises(ApiError) as e:
                client._call("POST", "/v1/generate", body)
            assert e.value.code == code and 400 <= e.value.status < 500
        with pytest.raises(ApiError) as e:
            client._call("GET", "/nope")
        assert e.value.status == 404
        # the server still serves after refusals; the same seed reproduces target-only
        a = client.generate(PROMPT, 5, seed=42, speculative=False)
        b = client.generate(PROMPT, 5, seed=42, speculative=False)
        assert a["token_ids"] == b["token_ids"] and a["seed"] == 42
    finally:
        client.close()
        pair.close()
