"""The chaos and soak commands: ``pp1q chaos proxy`` between real daemons (a fault spec
fires, stdin commands answer), argument refusals, and the checkout judge the matrix CLI
uses."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from daemon_distribution import exact_marginals

from pp1q.runtime.launcher import DaemonProcess, pp1q_command
from pp1q.tools.chaos.cli import checkout_judge
from pp1q.tools.client import Client

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

TIMEOUT_S = 60.0  # bound on each subprocess wait here


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pp1q.cli", *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def test_proxy_command_between_real_daemons(tmp_path):
    common = ["--vocab", "16", "--model-seed", "0", "--metrics-port", "0",
              "--speculation", "sampled"]
    worker = DaemonProcess("worker", pp1q_command("worker", "--listen", "127.0.0.1:0",
                                                  "--draft-preset", "close", *common),
                           str(tmp_path / "worker.log"))
    proxy = subprocess.Popen(
        pp1q_command("chaos", "proxy", "--upstream", f"127.0.0.1:{worker.port}",
                     "--fault", "drop:reply:index=2:nth=1"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    verifier = None
    try:
        banner = proxy.stdout.readline()
        assert banner.startswith("pp1q chaos proxy on 127.0.0.1:"), banner
        assert ", 1 rule; " in banner, banner  # one --fault
        port = int(banner.split()[4].rsplit(":", 1)[1].rstrip(","))
        verifier = DaemonProcess("verifier", pp1q_command(
            "verifier", "--worker", f"127.0.0.1:{port}", "--http", "127.0.0.1:0", *common),
            str(tmp_path / "verifier.log"))
        client = Client(f"http://127.0.0.1:{verifier.port}", timeout=TIMEOUT_S)
        client.wait_connected(TIMEOUT_S)
        answer = client.generate([3, 7], 12, seed=1)
        client.close()
        assert len(answer["token_ids"]) == 12
        assert {k: v for k, v in answer["stats"]["fallbacks"].items() if v} == \
            {"invalid_reply": 1}
        out, _ = proxy.communicate("stats\nbogus\nquit\n", timeout=TIMEOUT_S)
        assert "wire connections 1; injected: drop 1" in out
        assert "rule 1: 1/" in out and "? 'bogus'" in out
        assert proxy.returncode == 0
    finally:
        if proxy.poll() is None:
            proxy.kill()
        if verifier is not None:
            verifier.stop()
        worker.stop()


def test_refusals():
    r = _run("chaos", "proxy", "--upstream", "127.0.0.1:1", "--fault", "explode:reply")
    assert r.returncode == 2 and "unknown fault 'explode'" in r.stderr
    assert _run("chaos").returncode == 2
    r = _run("soak", "--seconds", "0")
    assert r.returncode == 2 and "must be positive" in r.stderr
    for bad in (["--abandon-p", "1.5"], ["--abandon-p", "-0.1"], ["--hang-s", "0"]):
        r = _run("soak", "--seconds", "1", *bad)
        assert r.returncode == 2 and "--abandon-p must be in [0, 1]" in r.stderr, bad
    # the real-model soak refuses the toy's own options (before it loads anything)
    for toy in (["--vocab", "16"], ["--streamed-sparse"], ["--target-delay-ms", "5"],
                ["--target-delay-ms", "0"], ["--vocab", "0"]):  # 0 is given too
        r = _run("soak", "--model", "embedded", "--seconds", "1", *toy)
        assert r.returncode == 2 and "the toy's options, not the real model's" in r.stderr, toy
    for vocab in ("0", "1"):  # the toy's vocabulary outside the daemons' bounds, at once
        r = _run("soak", "--seconds", "1", "--vocab", vocab)
        assert r.returncode == 2 and "--vocab must be in 2.." in r.stderr, r.stderr


def test_checkout_judge_fits_the_exact_marginals_and_rejects_a_shift():
    judge = checkout_judge()
    assert judge is not None  # tests/support/stats.py is here: this is a checkout
    exact = exact_marginals()
    n = 2000
    fits, verdict = judge(np.round(exact * n).astype(np.int64))
    assert fits and "G " in verdict
    shifted = np.round(np.roll(exact, 1, axis=1) * n).astype(np.int64)
    assert not judge(shifted)[0]
