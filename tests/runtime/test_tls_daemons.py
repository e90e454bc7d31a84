"""Mutual TLS with real daemon processes on 127.0.0.1: requests through the HTTP API
are verified speculatively over TLS, and a verifier without TLS is refused, counted by
the worker, and still answers (target-only)."""

from __future__ import annotations

import pytest
from daemon_harness import ROOT, Pair, scrape, value
from tls_certs import Ca

from pp1q.runtime.launcher import DaemonProcess, pp1q_command
from pp1q.tools.client import Client

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

REQUESTS = 4
MAX_TOKENS = 12
REFUSED = "pp1q_peers_refused_total"


def test_requests_through_the_http_api_over_mutual_tls(tmp_path):
    ca = Ca(tmp_path / "pki")
    worker, verifier = ca.issue("worker", server=True), ca.issue("verifier", server=False)
    pair = Pair(tmp_path, preset="close", worker_args=worker.args(),
                verifier_args=verifier.args())
    plain = None
    try:
        bodies = [{"prompt": [3, 7], "max_tokens": MAX_TOKENS, "seed": i}
                  for i in range(REQUESTS)]
        answers = pair.generate_many(bodies)
        for a in answers:
            assert len(a["token_ids"]) == MAX_TOKENS
            assert a["stats"]["rounds"] >= 1 and not any(a["stats"]["fallbacks"].values())
        w, v = pair.metrics("worker"), pair.metrics("verifier")
        assert value(v, "pp1q_rounds_total", kind="speculative") == sum(
            a["stats"]["rounds"] for a in answers)
        assert value(w, "pp1q_steps_total") == value(v, "pp1q_rounds_total", kind="speculative")
        assert all(value(m, REFUSED, reason=r) == 0 for m in (w, v)
                   for r in ("tls_handshake", "identity_mismatch", "hello_incompatible"))
        assert "mutual TLS" in pair.worker.log_tail(40)

        # a verifier without TLS: the worker refuses it at the handshake and counts it;
        # the verifier keeps serving, target-only
        plain = DaemonProcess("verifier", pp1q_command(
            "verifier", "--worker", f"127.0.0.1:{pair.worker.port}", "--http", "127.0.0.1:0",
            "--vocab", str(pair.vocab), "--metrics-port", "0", "--reconnect-max-s", "0.2",
            "--speculation", "sampled"),
            str(tmp_path / "plain-verifier.log"), cwd=str(ROOT))
        client = Client(f"http://127.0.0.1:{plain.port}", timeout=60)
        answer = client.generate([3, 7], 4, seed=1)
        assert len(answer["token_ids"]) == 4 and answer["stats"]["rounds"] == 0
        assert client.health()["worker"] == "disconnected"
        assert value(pair.metrics("worker"), REFUSED, reason="tls_handshake") >= 1
        assert value(scrape(plain.metrics_port), "pp1q_reconnects_total") == 0
    finally:
        if plain is not None:
            plain.stop()
        pair.close()
