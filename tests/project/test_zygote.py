"""The tests' daemon zygote (tests/support/zygote.py) gives a forked child what an exec
would: its arguments, environment, working directory, stdout pipe and stderr file, and
Popen's return codes; a daemon whose environment it cannot honour is exec'd."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from zygote import ZygoteChild

from pp1q.runtime.launcher import DaemonProcess, pp1q_command

pytestmark = pytest.mark.daemons

SUPPORT = Path(__file__).resolve().parents[1] / "support"
WORKER_ARGS = ("--listen", "127.0.0.1:0", "--vocab", "16", "--model-seed", "0",
               "--speculation", "sampled", "--metrics-port", "0")


@pytest.fixture
def zygote(daemon_zygote):
    if daemon_zygote is None:
        pytest.skip("PP1Q_TEST_ZYGOTE=0: every daemon is exec'd")
    return daemon_zygote


def test_a_child_gets_its_argv_cwd_environment_and_descriptors(tmp_path, zygote):
    assert zygote.started()
    with open(tmp_path / "stderr.log", "w") as stderr:
        child = ZygoteChild(zygote.path, [sys.executable, "-m", "zygote_probe", "a", "b c"],
                            stderr, {"PP1Q_ZYGOTE_PROBE": "seen"}, str(SUPPORT))
        said = json.loads(child.stdout.readline())
        assert child.wait(30) == 7 and child.returncode == 7 and child.poll() == 7
    assert said == {"argv": ["a", "b c"], "cwd": str(SUPPORT), "probe": "seen"}
    assert (tmp_path / "stderr.log").read_text() == "to stderr\n"


def test_a_forked_daemon_stops_gracefully_and_dies_by_signal(tmp_path, zygote):
    worker = DaemonProcess("worker", pp1q_command("worker", *WORKER_ARGS),
                           str(tmp_path / "worker.log"))
    assert isinstance(worker.proc, ZygoteChild)
    assert worker.port and worker.metrics_port  # its first stdout line was read
    with pytest.raises(subprocess.TimeoutExpired):
        worker.proc.wait(0.05)
    worker.stop()
    assert worker.proc.returncode == 0  # SIGTERM: the daemon's graceful stop
    assert "worker on 127.0.0.1:" in (tmp_path / "worker.log").read_text()  # stderr
    killed = DaemonProcess("worker", pp1q_command("worker", *WORKER_ARGS),
                           str(tmp_path / "killed.log"))
    killed.kill()
    assert killed.proc.returncode == -9


def test_a_daemon_choosing_another_backend_is_execd(tmp_path, monkeypatch, zygote):
    monkeypatch.setenv("PP1Q_VALIDATE", "numpy")  # the zygote chose at its own start
    worker = DaemonProcess("worker", pp1q_command("worker", *WORKER_ARGS),
                           str(tmp_path / "worker.log"))
    try:
        assert isinstance(worker.proc, subprocess.Popen)
    finally:
        worker.stop()
    log = (tmp_path / "worker.log").read_text()
    assert "q rows checked by numpy (PP1Q_VALIDATE=numpy)" in log
