"""``pp1q verifier --ranks N --shard-vocab``: each rank holds one vocabulary shard.

Daemons: 2 and 3 sharded ranks serve the same requests (sparse q, dense q scattered by
slices, target-only, greedy, a target temperature, top-p, top-k, both) with the same
tokens; a rank killed mid-request fails it
with 503 ranks_lost, counted, and the group exits (status 3), as the replicated group
does (test_ranks_failures.py). Units: the settings, the shard split, the toy shard's
logits against the whole row."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
from daemon_harness import Pair, value
from rank_harness import WAIT_S, assert_group_lost_once, child_pids, rank_metrics, wait_for

from pp1q.core.errors import ConfigError
from pp1q.models.toy import ToySpec, ToyTarget
from pp1q.runtime.settings import VerifierSettings
from pp1q.tools.client import ApiError
from pp1q.verifier.ranks.shard_target import ToyShard
from pp1q.verifier.ranks.sharded import balanced
from pp1q_kernels.shard_processors import MAX_SHARD_TOP_K

VOCAB = 37  # 2 ranks: 18 + 19 ids; 3 ranks: 12 + 12 + 13
PROMPT = [3, 7]


def _pair(tmp, world: int, *extra: str, **kw) -> Pair:
    return Pair(tmp, vocab=VOCAB, preset="close",
                verifier_args=["--ranks", str(world), "--shard-vocab", *extra], **kw)


def _serve_all(pair: Pair) -> list[list[int]]:
    c = pair.client()
    out = [c.generate(PROMPT, 24, seed=s)["token_ids"] for s in (1, 2, 3)]
    out.append(c.generate(PROMPT, 6, seed=4, speculative=False)["token_ids"])  # target-only
    out.append(c.generate(PROMPT, 12, seed=5, temperature=0.0)["token_ids"])  # greedy
    out.append(c.generate(PROMPT, 12, seed=6, temperature=0.7)["token_ids"])  # T on shards
    # the target's top-p / top-k across shards (pp1q_kernels.shard_processors), in
    # rounds and target-only steps alike
    out.append(c.generate(PROMPT, 12, seed=7, top_p=0.8)["token_ids"])
    out.append(c.generate(PROMPT, 12, seed=8, target_top_k=5, temperature=0.8)["token_ids"])
    out.append(c.generate(PROMPT, 8, seed=9, target_top_k=9, top_p=0.7,
                          speculative=False)["token_ids"])
    return out


@pytest.mark.daemons
@pytest.mark.parametrize("top_k", [  # dense q takes the scatter; sparse rides in the op
    pytest.param("0", id="dense-q"),
    pytest.param("8", id="sparse-q", marks=pytest.mark.slow)])  # gloo tests: sparse rows
def test_two_and_three_sharded_ranks_serve_the_same_tokens(tmp_path, top_k):
    answers = []
    for world in (2, 3):  # one draw secret (the pair's file in tmp_path) for both
        pair = _pair(tmp_path, world, "--top-k", top_k)
        try:
            answers.append(_serve_all(pair))
            m = rank_metrics(pair, world - 1)  # the last rank took part in every decision
            assert value(m, "pp1q_rank_decisions_total") > 0
        finally:
            pair.close()
    assert answers[0] == answers[1]
    assert all(0 <= t < VOCAB for run in answers[0] for t in run)


@pytest.mark.daemons
def test_sharded_rank_killed_mid_request_fails_stop(tmp_path):
    pair = _pair(tmp_path, 2, "--target-delay-ms", "20", "--rank-exit-grace-s", "120",
                 "--top-k", "0")
    try:
        box: dict = {}

        def run() -> None:
            try:
                box["answer"] = pair.client().generate(PROMPT, 2000, seed=1)
            except ApiError as e:
                box["error"] = e
        t = threading.Thread(target=run)
        t.start()
        assert wait_for(lambda: value(rank_metrics(pair, 0), "pp1q_generated_tokens_total")
                        >= 10), pair.logs()
        (rank1,) = child_pids(pair.verifier.proc.pid)
        os.kill(rank1, signal.SIGKILL)
        t.join(WAIT_S)
        assert_group_lost_once(pair, box)
        # no partial commit: the failed request's tokens never reached the caller
        assert "answer" not in box
        pair.verifier.stop()
        assert pair.verifier.proc.returncode == 3
    finally:
        pair.close()


def test_shard_vocab_settings_are_checked():
    assert VerifierSettings(ranks=2, shard_vocab=True, vocab=16).shard_vocab
    with pytest.raises(ConfigError, match="ranks >= 2"):
        VerifierSettings(shard_vocab=True)
    with pytest.raises(ConfigError, match="vocab of at least"):
        VerifierSettings(ranks=4, shard_vocab=True, vocab=3)


def test_balanced_split_is_contiguous_uneven_and_never_empty():
    assert balanced(37, 3) == ((0, 12), (12, 24), (24, 37))
    assert balanced(4, 4) == ((0, 1), (1, 2), (2, 3), (3, 4))
    for v, n in [(129280, 3), (129280, 16), (17, 16)]:
        b = balanced(v, n)
        assert b[0][0] == 0 and b[-1][1] == v and all(lo < hi for lo, hi in b)
        assert all(a[1] == c[0] for a, c in zip(b, b[1:], strict=False))


def test_toy_shard_logits_are_the_whole_rows_ids_bit_for_bit():
    target = ToyTarget(ToySpec(vocab=129280))
    for lo, hi in balanced(129280, 3):
        shard = ToyShard(target, lo, hi)
        for prefix, draft in [([], []), ([5], [9, 11]), ([1, 2, 3], [4, 5, 6, 7, 8])]:
            assert np.array_equal(shard.logits(0, prefix, draft).numpy(),
                                  target.logits(prefix, draft)[:, lo:hi])


def test_processors_a_group_cannot_apply_are_named_by_the_groups_size():
    from pp1q.models.processors import Processors
    from pp1q.verifier.daemon import unsupported_processors

    sharded, replicated = VerifierSettings(ranks=2, shard_vocab=True), VerifierSettings()
    warm, top_p, top_k = Processors(0.7), Processors(0.7, top_p=0.9), Processors(top_k=5)
    assert unsupported_processors(sharded, warm, 2) is None  # a temperature: per element
    assert unsupported_processors(sharded, top_p, 2) is None  # exact integers across shards
    assert unsupported_processors(sharded, top_k, 2) is None
    at_limit, over = Processors(top_k=MAX_SHARD_TOP_K), Processors(top_k=MAX_SHARD_TOP_K + 1)
    assert unsupported_processors(sharded, at_limit, 3) is None
    assert f"at most {MAX_SHARD_TOP_K}" in unsupported_processors(sharded, over, 2)
    # torchrun: --ranks stays 1, the group's size comes from its environment; a replicated
    # group's deciding rank holds whole rows and applies them all, as one process does
    for p in (warm, top_p, top_k, over):
        assert unsupported_processors(replicated, p, 2) is None
        assert unsupported_processors(replicated, p, 1) is None
