"""The steering attack with both real daemons (tests/verifier/test_steering.py in
process): the planted steering worker biases a verifier keyed the old way (a test-side
Decider) and leaves the production verifier's output exact, with every proposal
re-derived and nothing discarded."""

from __future__ import annotations

import pytest
from daemon_distribution import VOCAB, counts, exact_marginals, run_arm, worst_position
from daemon_harness import Pair, planted_steering_command, value
from stats import g_test

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

N_OLD = 1400  # the old keying's position-1 G is then ~2x its threshold (~108 vs 50)
N_NEW = 1000  # as the honest distribution experiment


def _run(tmp_path, n: int, verifier_cmd=None):
    pair = Pair(tmp_path, vocab=VOCAB, preset="far",
                worker_cmd=planted_steering_command("worker"), verifier_cmd=verifier_cmd)
    try:
        answers = run_arm(pair, n, True, 1)
        m = pair.metrics("verifier")
    finally:
        pair.close()
    log = "".join(p.read_text() for p in tmp_path.glob("worker*.log"))
    fallbacks = sum(v for (name, _), v in m.items() if name == "pp1q_fallbacks_total")
    return (counts(answers), log.count("steering: f="), fallbacks,
            value(m, "pp1q_validation_failures_total", reason="proposal_mismatch"))


def test_steering_worker_biases_a_verifier_keyed_by_the_step_seed(tmp_path):
    c, steered, fallbacks, mismatches = _run(tmp_path, N_OLD,
                                             planted_steering_command("verifier"))
    assert steered > 0 and fallbacks == 0 and mismatches == 0
    result = g_test(c[0], exact_marginals()[0])
    assert result.rejected, f"steering not detected at position 1: {result}"


def test_steering_worker_cannot_bias_verifier_owned_draws(tmp_path):
    c, steered, fallbacks, mismatches = _run(tmp_path, N_NEW)
    assert steered > 0 and fallbacks == 0 and mismatches == 0  # it tried; all re-derived
    worst, results = worst_position(c, exact_marginals())
    assert not worst.rejected, f"verifier-owned draws steered: {[str(r) for r in results]}"
