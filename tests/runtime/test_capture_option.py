"""``--capture FILE`` on the real daemons (child processes): the files they write replay
through ``pp1q replay --reverify`` with no divergence, and every commit is decided again
from the captured CONTEXT frames (on the wire connection since revision 2)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from daemon_harness import REPLAY_TIMEOUT_S, Pair, replay, value

from pp1q.runtime.capture import CaptureReader, Kind
from pp1q.runtime.draw_secret import write_secret_file
from pp1q.runtime.launcher import daemon_env, pp1q_command
from pp1q.tools.chaos.faults import BitFlip, Rule
from pp1q.wire import MsgType

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

REQUESTS = [  # (prompt, max_tokens, options): sparse and dense sampled, greedy
    ([1, 2, 3], 12, {"seed": 7}),
    ([4, 5], 10, {"seed": 8, "top_k": None, "draft_temperature": 0.8}),
    ([6, 7, 8], 8, {"seed": 9, "temperature": 0.0}),
]


def _replay(path, *extra) -> tuple[int, str]:
    proc = replay(path, *extra)
    return proc.returncode, proc.stdout + proc.stderr


def _secret(tmp_path) -> list[str]:
    return ["--draw-secret-file", str(tmp_path / "draw.secret")]  # the Pair's


def _run(tmp_path, rules=None, verifier_args=()) -> tuple[float, float]:
    """Both daemons with --capture; returns (verified rounds, fallbacks) from /metrics."""
    pair = Pair(tmp_path, vocab=64, rules=rules,
                worker_args=["--capture", str(tmp_path / "worker.pp1qcap")],
                verifier_args=["--capture", str(tmp_path / "verifier.pp1qcap"),
                               *verifier_args])
    try:
        client = pair.client()
        for prompt, n, options in REQUESTS:
            assert len(client.generate(prompt, n, **options)["token_ids"]) == n
        client.close()
        m = pair.metrics("verifier")
    finally:
        pair.close()  # SIGTERM: each daemon closes its capture
    verified = (value(m, "pp1q_rounds_total", kind="speculative")
                + value(m, "pp1q_rounds_total", kind="greedy"))
    return verified, sum(v for (name, _), v in m.items() if name == "pp1q_fallbacks_total")


def test_captures_of_both_daemons_replay_without_divergence(tmp_path):
    verified, fallbacks = _run(tmp_path)
    assert verified >= len(REQUESTS) and fallbacks == 0
    for side in ("worker", "verifier"):
        path = tmp_path / f"{side}.pp1qcap"
        rc, out = _replay(path, "--reverify", "--json", *_secret(tmp_path))
        assert rc == 0, out
        report = json.loads(out)
        assert report["ok"] and not report["divergences"] and not report["failures"], side
        assert len(report["commits"]) == verified, side  # one COMMIT per verified round
        assert report["rechecked"] == verified and report["not_rechecked"] == 0, side
        rc, text = _replay(path)  # the analyser reads it too
        assert rc == 0 and " CONTEXT " in text and "COMMIT" in text, text[-2000:]


def test_reverify_needs_the_draw_secret_and_the_capture_never_holds_it(tmp_path):
    _run(tmp_path)
    path = tmp_path / "verifier.pp1qcap"
    secret = bytes.fromhex((tmp_path / "draw.secret").read_text())
    data = path.read_bytes()
    assert secret not in data and secret.hex().encode() not in data  # fingerprint only
    rc, out = _replay(path, "--reverify", "--json")
    assert rc == 2 and "pass --draw-secret-file" in out, out
    other = tmp_path / "other.secret"
    write_secret_file(str(other))
    rc, out = _replay(path, "--reverify", "--json", "--draw-secret-file", str(other))
    assert rc == 2 and "fingerprint" in out, out
    # a worker's capture names no fingerprint: a wrong secret shows as divergences
    rc, out = _replay(tmp_path / "worker.pp1qcap", "--reverify", "--json",
                      "--draw-secret-file", str(other))
    assert rc == 1 and json.loads(out)["divergences"], out


def test_capture_of_ranked_verifier_redecides_every_commit_alike(tmp_path):
    """Two verifier ranks: rank 0 records; rounds decided by rank 1 are decided again
    here by one process from the captured q and must give the captured COMMITs."""
    verified, fallbacks = _run(tmp_path, verifier_args=["--ranks", "2", "--slots", "2"])
    assert verified >= len(REQUESTS) and fallbacks == 0
    rc, out = _replay(tmp_path / "verifier.pp1qcap", "--reverify", "--json",
                      *_secret(tmp_path))
    assert rc == 0, out
    report = json.loads(out)
    assert report["ok"] and report["rechecked"] == len(report["commits"]) == verified
    # freed slots queue at the back: the three requests ran on slots 0, 1, 0, so both
    # ranks decided some of the replayed rounds
    assert {c["slot"] for c in report["commits"]} == {0, 1}


def test_capture_of_a_corrupted_reply_replays_as_the_same_fallback(tmp_path):
    fault = Rule(BitFlip("payload", offset=0, bit=0), msg_type=MsgType.REPLY)
    verified, fallbacks = _run(tmp_path, [fault])
    assert fault.fired == 1 and fallbacks == 1
    rc, out = _replay(tmp_path / "verifier.pp1qcap", "--reverify", "--json",
                      *_secret(tmp_path))
    assert rc == 0, out
    report = json.loads(out)
    assert report["ok"] and not report["divergences"]
    assert [f["reason"] for f in report["failures"]] == ["checksum_mismatch"]
    assert len(report["commits"]) == report["rechecked"] == verified
    # the worker sent the frame intact (the proxy flipped the bit): its capture shows
    # the verifier's RESET of a proposal that validated there, still no divergence
    rc, out = _replay(tmp_path / "worker.pp1qcap", "--verify", "--json")
    assert rc == 0, out
    assert not json.loads(out)["failures"]


@pytest.mark.parametrize("kind", ["missing folder", "fifo"])
def test_unwritable_capture_path_is_a_settings_error(tmp_path, kind):
    """A FIFO with no reader blocked the worker's start for ever in open(); the run's
    timeout turns a regression into a failure."""
    path = tmp_path / "no" / "such" / "x"
    if kind == "fifo":
        path = tmp_path / "x.pp1qcap"
        os.mkfifo(path)
    proc = subprocess.run(pp1q_command("worker", "--listen", "127.0.0.1:0", "--vocab", "16",
                                       "--capture", str(path)),
                          capture_output=True, text=True, timeout=REPLAY_TIMEOUT_S,
                          env=daemon_env())
    assert proc.returncode == 2, proc.stderr
    assert "cannot create capture" in proc.stderr
    if kind == "fifo":
        assert proc.stderr.splitlines()[-1] == (
            f"pp1q worker: capture = {str(path)!r}: cannot create capture file: "
            f"is a FIFO, not a regular file")


def test_capture_max_bytes_stops_recording_at_the_cap_and_serving_goes_on(tmp_path):
    cap = 1 << 20  # the least the setting takes; dense rows at vocab 32768 pass it in 2 rounds
    path = tmp_path / "verifier.pp1qcap"
    pair = Pair(tmp_path, vocab=32768,
                verifier_args=["--capture", str(path), "--capture-max-bytes", str(cap)])
    try:
        client = pair.client()
        for seed in (1, 2):  # dense sampled steps: 128 KiB a row
            out = client.generate([1, 2, 3], 12, seed=seed, top_k=None)
            assert len(out["token_ids"]) == 12
        client.close()
        m = pair.metrics("verifier")
    finally:
        pair.close()
    assert value(m, "pp1q_rounds_total", kind="speculative") >= 2
    assert path.stat().st_size <= cap
    records = CaptureReader(path).records()
    assert records[-1].kind is Kind.INFO and records[-1].meta == {"stopped": "max_bytes"}
    assert sum(r.kind is Kind.DATA for r in records) > 0  # it recorded until the cap
