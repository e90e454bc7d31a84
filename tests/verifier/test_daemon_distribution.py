"""Both daemons as real processes: speculative output is distributed exactly as the target.

Vocabulary 16, the "far" toy drafter (about 60% of first drafts rejected, so corrections
matter), prompt [3, 7], 3 new tokens per request, request seeds 1..N. Each of the three
positions' marginals is compared with its exact value under the target (summed over all
earlier tokens) by the judge of tests/support/stats.py (G; false alarms under 1e-6); the
speculative and target-only samples are also compared with each other (Pearson
contingency at 1e-6). The same check must reject a verifier with a planted bug
(tests/support/planted_verifier.py: corrections drawn from p instead of the residual);
with N = 1000 its G at position 1 read 134 against a threshold of 48 (power ~1).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from daemon_distribution import (
    N_SLOW,
    PROCESSED,
    VOCAB,
    N,
    check_arms,
    counts,
    exact_marginals,
    explain_rejection,
    run_arm,
    worst_position,
)
from daemon_harness import Pair, planted_verifier_command

from pp1q.models.processors import Processors

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

def _distribution_run(tmp_path, n):
    capture = tmp_path / "verifier.pp1qcap"  # read only if a check below fails
    pair = Pair(tmp_path, vocab=VOCAB, preset="far", verifier_args=["--capture", str(capture)])
    try:
        spec = run_arm(pair, n, True, 1)
        base = run_arm(pair, n, False, 1)
    finally:
        pair.close()  # SIGTERM: the verifier closes its capture
    check_arms(spec, base, lambda label, c, exact, results: explain_rejection(
        label, c, exact, results, capture, pair.draw_secret))


def test_speculative_equals_target_in_distribution(tmp_path):
    _distribution_run(tmp_path, N)


@pytest.mark.slow
def test_speculative_equals_target_in_distribution_long(tmp_path):
    _distribution_run(tmp_path, N_SLOW)


def test_planted_bug_verifier_is_rejected(tmp_path):
    exact = exact_marginals()
    pair = Pair(tmp_path, vocab=VOCAB, preset="far", verifier_cmd=planted_verifier_command())
    try:
        spec = run_arm(pair, N, True, 1)
    finally:
        pair.close()
    worst, results = worst_position(counts(spec), exact)
    assert worst.rejected, f"planted bug not caught: {[str(r) for r in results]}"


def _processed_exact() -> np.ndarray:
    return exact_marginals(Processors(PROCESSED["temperature"], None, PROCESSED["top_p"]))


def test_processed_p_sparse_q_draft_temperature_match_target(tmp_path):
    """Target T = 0.7 and top-p 0.9 on p, a top-4 q drafted at T = 0.6: speculative output
    is distributed as processed target-only sampling (exact marginals), over HTTP."""
    exact = _processed_exact()
    pair = Pair(tmp_path, vocab=VOCAB, preset="far")
    try:
        spec = run_arm(pair, N, True, 1, PROCESSED)
    finally:
        pair.close()
    drafted = sum(a["stats"]["drafted"] for a in spec)
    accepted = sum(a["stats"]["accepted"] for a in spec)
    assert 0 < accepted < drafted and not any(
        any(a["stats"]["fallbacks"].values()) for a in spec)
    worst, results = worst_position(counts(spec), exact)
    assert not worst.rejected, f"processed speculative vs exact: {[str(r) for r in results]}"


def test_planted_processors_on_one_path_is_rejected(tmp_path):
    exact = _processed_exact()
    pair = Pair(tmp_path, vocab=VOCAB, preset="far",
                verifier_cmd=planted_verifier_command("processors_one_path"))
    try:
        spec = run_arm(pair, N, True, 1, PROCESSED)
    finally:
        pair.close()
    worst, results = worst_position(counts(spec), exact)
    assert worst.rejected, f"planted bug not caught: {[str(r) for r in results]}"


def test_exact_marginals_sum_to_one():
    m = exact_marginals()
    assert np.allclose(m.sum(axis=1), 1.0)
    assert len(list(itertools.product(range(VOCAB), repeat=2))) == VOCAB**2
