"""The steering attack (docs/security.md) against the old and the new keying.

A planted worker (tests/support/planted_steering.py, through the Proposer seam) predicts
the acceptance draw from the STEP's seed and sends a row that nearly forces its favourite
token f exactly when that draw would accept f. Its x_1 is still drawn honestly from the
row it sends, so the proposal re-derivation holds on every round.

- Old keying (every draw keyed by the STEP's seed; a test-side DrawKeys,
  WorkerKnownDraws, here and the OldKeying Decider in the daemon test; production has no
  such switch): the output at position 1 over-weights f and the judge's G against
  the target rejects at alpha 1e-6.
- Verifier-owned draws (production): the same worker, the same rounds, and the output
  passes the same judge as an honest worker's.
- What the new keying does not stop: a worker that builds q around the PROPOSAL draw it
  must know (one count of f where the draw lands) still dictates f. That is why the
  worker stays inside the trust boundary for the distribution (docs/security.md).

In process: the worker's rows and the verifier's decision functions (rounds.sampled,
rounds.proposal_matches) exactly as the daemons call them; the daemon-level version
runs both real processes.
"""

from __future__ import annotations

import numpy as np
import pytest
from planted_steering import ProposalSteering, Steering, WorkerKnownDraws, favourite
from stats import g_test

from pp1q.core.drawkey import DrawKeys
from pp1q.core.prefix import Prefix
from pp1q.core.verify import RoundKeys
from pp1q.models.toy import ToyDrafter, ToySpec, ToyTarget
from pp1q.verifier import rounds
from pp1q.wire import Step
from pp1q.worker.drafting import Proposer

pytestmark = pytest.mark.experiment  # thousands of rounds per arm

VOCAB = 16
PROMPT = [3, 7]
DEPTH = 3
TRIALS = 1500  # rounds per arm: the old keying's G is then ~2.3x its threshold (116-119 vs 50)
SECRET = DrawKeys(bytes.fromhex("5eed" * 16))
SPEC = ToySpec(vocab=VOCAB, seed=0)
TARGET = ToyTarget(SPEC)
P1 = TARGET.probs(PROMPT, [])[0]  # the exact marginal of output position 1


def _step(seed: int, top_k: int) -> Step:
    last = len(PROMPT) - 1
    return Step(session=1, slot=0, generation=1, round_id=1, last_committed=last,
                first_position=last + 1, prefix_digest=Prefix(PROMPT).digest, depth=DEPTH,
                temperature=1.0, top_k=top_k, context_version=0, seed=seed)


def _arm(proposer_cls, draws: DrawKeys, top_k: int = 0, trials: int = TRIALS):
    """Output position 1 of ``trials`` rounds (request seeds 1..trials); every round's
    proposal re-derives from its q and the STEP's seed, as the scheduler checks."""
    proposer = proposer_cls(ToyDrafter.preset(SPEC, "far"))
    counts = np.zeros(VOCAB, dtype=np.int64)
    mismatches = 0
    for seed in range(1, trials + 1):
        step = _step(seed, top_k)
        drafts, q_rows = zip(*proposer.rows(step, PROMPT), strict=True)
        mismatches += not rounds.proposal_matches(
            q_rows, drafts, RoundKeys(seed, step.generation, step.round_id,
                                      step.first_position))
        p = TARGET.probs(PROMPT, list(drafts))
        keys = RoundKeys(draws.seed_for(seed), step.generation, step.round_id,
                         step.first_position)
        out = rounds.sampled(p, q_rows, drafts, keys)
        counts[drafts[0] if out.accepted >= 1 else out.token] += 1
    return counts, mismatches, getattr(proposer, "steered", None)


@pytest.mark.parametrize("top_k", [0, 8])
def test_steering_biases_the_old_keying(top_k):
    counts, mismatches, steered = _arm(Steering, WorkerKnownDraws(), top_k)
    result = g_test(counts, P1)
    assert mismatches == 0 and steered > TRIALS // 20  # it steered, never caught
    assert result.rejected, f"steering not detected: {result}"
    f = favourite(P1)
    assert counts[f] / TRIALS > P1[f] + 0.05  # and the bias is towards its favourite


@pytest.mark.parametrize("top_k", [0, 8])
def test_steering_is_harmless_under_verifier_owned_draws(top_k):
    counts, mismatches, steered = _arm(Steering, SECRET, top_k)
    result = g_test(counts, P1)
    assert mismatches == 0 and steered > TRIALS // 20  # it tried just as often
    assert not result.rejected, f"verifier-owned draws still steered: {result}"


def test_an_honest_worker_passes_the_old_keying():
    # control: the old keying itself is exact with an honest worker, so the bias above
    # is the steering's (honest workers under the new keying: test_daemon_distribution)
    counts, mismatches, _ = _arm(Proposer, WorkerKnownDraws())
    assert mismatches == 0 and not g_test(counts, P1).rejected


def test_steering_on_the_proposal_draw_is_not_stopped_by_the_new_keying():
    # the documented limit: q built around the proposal draw the worker must know
    trials = TRIALS // 10  # f nearly every time: a few hundred rounds show it
    counts, mismatches, _ = _arm(ProposalSteering, SECRET, trials=trials)
    f = favourite(P1)
    assert mismatches == 0  # the re-derivation cannot see it either
    assert g_test(counts, P1).rejected and counts[f] > 0.95 * trials


def test_same_seed_and_secret_give_the_same_draw_seed_and_another_secret_does_not():
    again = DrawKeys(bytes.fromhex("5eed" * 16))
    assert [SECRET.seed_for(s) for s in range(50)] == [again.seed_for(s) for s in range(50)]
    other = DrawKeys(bytes.fromhex("5eee" * 16))
    assert all(SECRET.seed_for(s) != other.seed_for(s) for s in range(50))
    assert all(SECRET.seed_for(s) != s for s in range(50))  # never the STEP's seed
