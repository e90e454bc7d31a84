"""The verifier re-derives every proposal from its q and the PROPOSAL-domain key."""

import pytest

from pp1q.core.verify import RoundKeys
from pp1q.models.toy import toy_pair
from pp1q.verifier.rounds import proposal_matches
from pp1q.worker.proposer import ProposalSpec, propose

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

VOCAB = 64
PREFIX = [3, 1, 4, 1, 5]


def _chain(seed, temperature=0.9, top_k=None, generation=2, round_id=7, first_position=5):
    drafter, _ = toy_pair(VOCAB, 0, "far")
    spec = ProposalSpec(seed, generation, round_id, first_position, 5, temperature, top_k)
    chain = list(propose(drafter, PREFIX, spec))
    return [t for t, _ in chain], [q for _, q in chain]


@pytest.mark.parametrize("top_k", [None, 8])
def test_honest_proposals_match_on_many_seeds(top_k):
    for seed in range(50):
        drafts, rows = _chain(seed, top_k=top_k)
        assert proposal_matches(rows, drafts, RoundKeys(seed, 2, 7, 5))


def test_wrong_key_fields_are_caught():
    drafts, rows = _chain(11)
    wrong = [RoundKeys(12, 2, 7, 5), RoundKeys(11, 3, 7, 5), RoundKeys(11, 2, 8, 5),
             RoundKeys(11, 2, 7, 6)]
    # each mismatched key field is caught on at least one of many seeds' rounds
    for keys in wrong:
        hits = 0
        for seed in range(30):
            d, r = _chain(seed)
            k = RoundKeys(keys.seed + seed - 11, keys.generation, keys.round_id,
                          keys.first_position)
            hits += not proposal_matches(r, d, k)
        assert hits > 0, keys


def test_q_not_the_q_that_sampled_is_caught():
    # planted bug (transformers #47932 / #40949 class): sampled at T=1.0, q sent built at 0.6
    caught = 0
    for seed in range(30):
        drafts, _ = _chain(seed, temperature=1.0)
        _, rows_other_t = _chain(seed, temperature=0.6)
        caught += not proposal_matches(rows_other_t, drafts, RoundKeys(seed, 2, 7, 5))
    assert caught >= 15


def test_q_row_shifted_by_one_position_is_caught():
    caught = 0
    for seed in range(30):
        drafts, rows = _chain(seed)
        shifted = rows[1:] + rows[:1]
        caught += not proposal_matches(shifted, drafts, RoundKeys(seed, 2, 7, 5))
    assert caught >= 25


def _run_pair(tmp_path, worker_cmd):
    from daemon_harness import Pair, value

    tmp_path.mkdir()
    pair = Pair(tmp_path, preset="far", worker_cmd=worker_cmd)
    try:
        bodies = [{"prompt": [3, 7], "max_tokens": 6, "seed": s, "draft_temperature": 0.3}
                  for s in range(4)]
        answers = pair.generate_many(bodies)
        m = pair.metrics("verifier")
        return answers, (value(m, "pp1q_fallbacks_total", cause="invalid_reply"),
                         value(m, "pp1q_validation_failures_total", reason="proposal_mismatch"))
    finally:
        pair.close()


def test_daemons_discard_a_proposal_whose_q_did_not_sample_it(tmp_path):
    """Real daemons: a worker that sends q at T=1 after sampling at T=0.3 gets its rounds
    discarded (invalid_reply, proposal_mismatch), counted, and every request completes;
    the honest worker with the same requests shows no mismatch."""
    from daemon_harness import planted_worker_command

    answers, (invalid, mismatches) = _run_pair(tmp_path / "planted", planted_worker_command())
    assert [len(a["token_ids"]) for a in answers] == [6] * 4
    assert invalid == mismatches == sum(a["stats"]["fallbacks"]["invalid_reply"]
                                        for a in answers)
    # a bad q goes unnoticed only when all five drafts happen to agree
    assert mismatches >= 8
    answers, (invalid, mismatches) = _run_pair(tmp_path / "honest", None)
    assert [len(a["token_ids"]) for a in answers] == [6] * 4
    assert invalid == mismatches == 0
