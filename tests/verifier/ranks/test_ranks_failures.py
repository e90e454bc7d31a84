"""Verifier ranks failing: a rank killed or hung mid-request, ranks that commit different
tokens (a planted bug), ranks with different models; and the explicit and torchrun
launch forms. The rule (docs/operations.md, "Ranks"): a lost rank fails the open
requests with 503 ranks_lost, counted, and every surviving rank exits with status 3
after the grace period; a refused op fails its request with 500 rank_disagreement,
counted, and the group stays up."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
from daemon_harness import ROOT, Pair, value
from rank_harness import (
    WAIT_S,
    assert_group_lost_once,
    child_pids,
    free_port,
    log_text,
    rank_metrics,
    ranked_pair,
    wait_for,
)

from pp1q.runtime.launcher import daemon_env, pp1q_command
from pp1q.tools.client import ApiError

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

PROMPT = [3, 7]
LONG_REQUEST = 2000  # tokens: far longer than the moment at which the test breaks a rank
UNDERWAY = 10  # generated tokens that show the long request is under way on both ranks


def _health(pair) -> tuple[int, dict]:
    """/healthz status and body, also when it is not 200."""
    try:
        with urllib.request.urlopen(pair.url + "/healthz", timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def _long_request(pair, box: dict) -> threading.Thread:
    def run() -> None:
        try:
            box["answer"] = pair.client().generate(PROMPT, LONG_REQUEST, seed=1)
        except ApiError as e:
            box["error"] = e
    t = threading.Thread(target=run)
    t.start()
    assert wait_for(lambda: value(rank_metrics(pair, 0), "pp1q_generated_tokens_total")
                    >= UNDERWAY), pair.logs()
    return t


def _rank1(pair) -> int:
    (pid,) = child_pids(pair.verifier.proc.pid)
    return pid


def test_rank_killed_mid_request_fails_it_counted_and_the_group_exits(tmp_path):
    pair = ranked_pair(tmp_path, "--target-delay-ms", "20", "--rank-exit-grace-s", "120",
                       preset="close")
    try:
        box: dict = {}
        t = _long_request(pair, box)
        os.kill(_rank1(pair), signal.SIGKILL)
        t.join(WAIT_S)
        assert_group_lost_once(pair, box)
        status, health = _health(pair)
        assert status == 503 and health["ranks"]["state"] == "lost"
        with pytest.raises(ApiError) as again:  # refused at once while the group is down
            pair.client().generate(PROMPT, 4, seed=2, speculative=False)
        assert again.value.code == "ranks_lost"
        pair.verifier.stop()  # within the grace period: still status 3
        assert pair.verifier.proc.returncode == 3
    finally:
        pair.close()


def test_rank_hung_times_out_and_rank_0_exits_by_itself(tmp_path):
    pair = ranked_pair(tmp_path, "--target-delay-ms", "20", "--rank-timeout-s", "1.5",
                       "--rank-exit-grace-s", "0.5", preset="close")
    rank1 = _rank1(pair)
    try:
        box: dict = {}
        t = _long_request(pair, box)
        os.kill(rank1, signal.SIGSTOP)  # alive, connected, silent
        t.join(WAIT_S)
        err = box.get("error")
        assert err is not None and (err.status, err.code) == (503, "ranks_lost"), box
        os.kill(rank1, signal.SIGCONT)  # it finds the group gone and exits too
        pair.verifier.proc.wait(WAIT_S)
        assert pair.verifier.proc.returncode == 3
        log = log_text(pair.verifier)
        assert "verifier rank group lost (rank_timeout)" in log
        assert "rank 1 lost the group" in log
    finally:
        if os.path.exists(f"/proc/{rank1}"):
            os.kill(rank1, signal.SIGKILL)
        pair.close()


def test_ranks_that_commit_their_own_draws_are_caught_and_nothing_diverges(tmp_path):
    """vLLM #17498 planted (tests/support/planted_ranks.py): the non-deciding rank keeps its own
    draw. The next op of the slot finds the prefixes differ: every rank discards it."""
    pair = Pair(tmp_path, preset="far", verifier_args=["--ranks", "2"],
                verifier_cmd=[sys.executable, str(ROOT / "tests" / "support" / "planted_ranks.py")])
    try:
        client = pair.client()
        failed = 0
        for seed in range(1, 9):  # one at a time: slot 0, decided by rank 0 every time
            try:
                client.generate(PROMPT, 12, seed=seed)
            except ApiError as e:
                assert (e.status, e.code) == (500, "rank_disagreement"), e
                failed += 1
        assert failed >= 4
        m = rank_metrics(pair, 0)
        assert value(m, "pp1q_rank_failures_total", cause="digest_mismatch") == failed
        assert value(m, "pp1q_requests_total", outcome="error") == failed
        assert _health(pair)[0] == 200  # the group itself is fine
    finally:
        pair.close()
    assert pair.verifier.proc.returncode == 0


def _rank_cmd(rank: int, port: int, vocab: int, *extra: str) -> list[str]:
    return pp1q_command("verifier", "--ranks", "2", "--rank", str(rank), "--rank-master",
                        f"127.0.0.1:{port}", "--vocab", str(vocab), "--rank-join-timeout-s",
                        "60", "--speculation", "sampled", *extra)


def test_explicit_form_ranks_started_one_by_one(tmp_path):
    port = free_port()
    with open(tmp_path / "rank1.log", "w") as log:  # first: it waits for rank 0's store
        rank1 = subprocess.Popen(_rank_cmd(1, port, 16), stdout=log, stderr=log,
                                 env=daemon_env())
    pair = None
    try:
        pair = Pair(tmp_path, vocab=16, verifier_cmd=_rank_cmd(0, port, 16))
        answer = pair.client().generate(PROMPT, 8, seed=3)
        assert len(answer["token_ids"]) == 8
        assert _health(pair)[1]["ranks"]["world"] == 2
        pair.verifier.stop()
        assert pair.verifier.proc.returncode == 0
        assert rank1.wait(WAIT_S) == 0  # rank 0 stopped the group: rank 1 exits 0
        assert "joined 127.0.0.1:" in (tmp_path / "rank1.log").read_text()
    finally:
        if rank1.poll() is None:
            rank1.kill()
        if pair is not None:
            pair.close()


def test_ranks_with_different_models_refuse_to_form(tmp_path):
    port = free_port()
    procs = [subprocess.Popen(_rank_cmd(r, port, vocab, "--http", "127.0.0.1:0"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=daemon_env()) for r, vocab in ((0, 16), (1, 32))]
    outs = [p.communicate(timeout=WAIT_S * 2)[0] for p in procs]
    assert [p.returncode for p in procs] == [2, 2], outs
    for out in outs:
        assert re.search(r"verifier ranks disagree on (target|vocab)", out), out


def test_torchrun_form(tmp_path):
    pair = Pair(tmp_path, vocab=16, wait=False)  # its verifier stays our single one
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "pp1q.cli",
           "verifier", "--worker", f"127.0.0.1:{pair.worker.port}", "--http",
           "127.0.0.1:0", "--vocab", "16", "--speculation", "sampled",
           "--draw-secret-file", str(pair.draw_secret)]  # the same draws as the pair's
    with open(tmp_path / "torchrun.log", "w") as log:
        run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                               env=daemon_env())
    try:
        http = None
        for line in run.stdout:  # rank 1's banner may come first
            if m := re.search(r"HTTP on 127\.0\.0\.1:(\d+)", line):
                http = int(m.group(1))
                break
        assert http is not None
        threading.Thread(target=lambda: run.stdout.read(), daemon=True).start()
        one = pair.client().generate(PROMPT, 8, seed=3, speculative=False)
        pair.url = f"http://127.0.0.1:{http}"
        pair.client().wait_connected(WAIT_S)
        ranked = pair.client().generate(PROMPT, 8, seed=3, speculative=False)
        assert ranked["token_ids"] == one["token_ids"]
        assert _health(pair)[1]["ranks"]["world"] == 2
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(WAIT_S)
        pair.close()
