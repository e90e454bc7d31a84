"""Two verifier ranks (gloo on CPU), end to end through the HTTP API: the output is
distributed exactly as the target's, target-only output is the one-process output, and
each fault of the daemon tests (late reply, corrupt byte, worker killed) is handled as
with one process, with the generation invalidated on every rank. Rank 0 spawns rank 1;
slots are decided by rank ``slot % 2``, so both ranks decide."""

from __future__ import annotations

import threading

import pytest
from daemon_distribution import (
    N_SLOW,
    VOCAB,
    N,
    check_arms,
    run_arm,
)
from daemon_harness import Pair, fallbacks_of, one_request, value, wait_fired
from rank_harness import log_text, rank_failures, rank_metrics, ranked_pair, wait_metric

from pp1q.tools.chaos.faults import BitFlip, Delay, Drop, Rule
from pp1q.wire import MsgType

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

SAME_AS_ONE_PROCESS = 200  # target-only answers compared token by token


def _distribution_run(tmp_path, n, *verifier_args):
    tmp_path.mkdir(exist_ok=True)
    pair = ranked_pair(tmp_path, *verifier_args, vocab=VOCAB, preset="far")
    try:
        spec = run_arm(pair, n, True, 1)
        base = run_arm(pair, n, False, 1)
        m0, m1 = rank_metrics(pair, 0), rank_metrics(pair, 1)
    finally:
        pair.close()
    assert "rank 1: the group stopped" in log_text(pair.verifier)
    assert pair.verifier.proc.returncode == 0
    for m in (m0, m1):  # both ranks decided, nobody refused anything
        assert value(m, "pp1q_rank_decisions_total") > 0
        assert value(m, "pp1q_rank_world_size") == 2
        assert rank_failures(m) == 0
    check_arms(spec, base)
    return base


def test_two_ranks_speculative_equals_target_in_distribution(tmp_path):
    base = _distribution_run(tmp_path / "ranks", N)
    (tmp_path / "one").mkdir()
    one = Pair(tmp_path / "one", vocab=VOCAB, preset="far",  # the ranks' draw secret
               verifier_args=["--draw-secret-file", str(tmp_path / "ranks" / "draw.secret")])
    try:
        alone = run_arm(one, SAME_AS_ONE_PROCESS, False, 1)
    finally:
        one.close()
    # target-only output is a pure function of (prompt, seed, draw secret): the rank
    # that drew it, 0 or 1 (rank 1 got the secret at join), drew what one process draws
    assert [a["token_ids"] for a in alone] == [a["token_ids"] for a in
                                                base[:SAME_AS_ONE_PROCESS]]


@pytest.mark.slow  # the default run: tests/kernels/test_kernels_shard_step.py's G
def test_two_vocabulary_sharded_ranks_speculative_equals_target_in_distribution(tmp_path):
    # (in process, with its planted local normaliser) and the sharded daemons' token
    # identity with one rank (test_ranks_shard_daemon.py)
    # --shard-vocab: every rank holds half the vocabulary and both take part in every
    # decision; the judge (G) of both arms against the exact target marginals (the sharded
    # p is an ulp from the toy's softmax at most) and against each other
    _distribution_run(tmp_path, N, "--shard-vocab")


@pytest.mark.slow
def test_two_ranks_speculative_equals_target_in_distribution_long(tmp_path):
    _distribution_run(tmp_path, N_SLOW)


# -- faults, one per kind of the daemon tests ----------------------------------------


def _no_rank_failures(pair) -> None:
    for r in (0, 1):
        assert rank_failures(rank_metrics(pair, r)) == 0


def test_late_reply_invalidates_on_every_rank(tmp_path):
    fault = Rule(Delay(1.5), msg_type=MsgType.COMPLETION)
    pair = ranked_pair(tmp_path, "--watchdog-ms", "500", preset="close", rules=[fault])
    try:
        answer = one_request(pair)
        assert len(answer["token_ids"]) == 12
        assert fallbacks_of(answer) == {"watchdog_timeout": 1}
        m = rank_metrics(pair, 0)
        assert value(m, "pp1q_watchdog_timeouts_total") == 1
        assert value(m, "pp1q_generation_invalidations_total") == 1
        assert value(rank_metrics(pair, 1), "pp1q_generation_invalidations_total") == 1
        assert wait_metric(pair, 0, "pp1q_late_replies_discarded_total", 1,
                           reason="stale_generation") == 1
        _no_rank_failures(pair)
    finally:
        pair.close()


def test_corrupt_byte_discards_the_proposal_on_every_rank(tmp_path):
    fault = Rule(BitFlip("payload", offset=0, bit=0), msg_type=MsgType.REPLY)
    pair = ranked_pair(tmp_path, preset="close", rules=[fault])
    try:
        answer = one_request(pair)
        assert len(answer["token_ids"]) == 12 and fault.fired == 1
        assert fallbacks_of(answer) == {"invalid_reply": 1}
        m = rank_metrics(pair, 0)
        assert value(m, "pp1q_validation_failures_total", reason="checksum_mismatch") == 1
        assert value(m, "pp1q_generation_invalidations_total") == 1
        assert value(rank_metrics(pair, 1), "pp1q_generation_invalidations_total") == 1
        assert answer["stats"]["rounds"] >= 1  # and it goes on speculating
        _no_rank_failures(pair)
    finally:
        pair.close()


def test_worker_killed_mid_round_then_restarted(tmp_path):
    fault = Rule(Drop(), msg_type=MsgType.COMPLETION)
    pair = ranked_pair(tmp_path, "--watchdog-ms", "10000", preset="close", rules=[fault])
    try:
        box: dict = {}
        t = threading.Thread(target=lambda: box.update(answer=one_request(pair, max_tokens=10)))
        t.start()
        assert wait_fired(fault, 30), pair.logs()
        port = pair.worker.port
        pair.worker.kill()
        t.join(60)
        answer = box["answer"]
        assert len(answer["token_ids"]) == 10
        falls = fallbacks_of(answer)
        assert falls.pop("connection_lost") == 1 and set(falls) <= {"worker_unavailable"}
        assert value(rank_metrics(pair, 1), "pp1q_generation_invalidations_total") == 1
        pair.worker = pair.start_worker(f"127.0.0.1:{port}")
        pair.client().wait_connected(30)
        again = one_request(pair, max_tokens=10, seed=2)
        assert again["stats"]["rounds"] >= 1 and not fallbacks_of(again)
        _no_rank_failures(pair)
    finally:
        pair.close()
