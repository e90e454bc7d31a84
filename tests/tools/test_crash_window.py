"""The soak's reads of a worker it crashes on purpose (pp1q.tools.chaos.crash_window): a
scrape cut by the crash is counted and skipped, never a failure of the soak; a failed
scrape outside every crash, or of the verifier (never crashed), still fails it."""

from __future__ import annotations

import http.client
import random
import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from pp1q.tools.chaos.crash_window import CrashWindow
from pp1q.tools.chaos.soak import _sample_slots


def _cut():
    raise http.client.IncompleteRead(b"# HELP pp1q_", 1200)  # a body cut by SIGKILL


def _refused():
    raise ConnectionRefusedError  # no worker listening


def test_a_read_cut_while_a_crash_is_under_way_is_counted_not_raised():
    w = CrashWindow()
    with w.crash():
        assert w.read(_cut) is None
        assert w.read(lambda: 7) == 7  # a read that succeeds is just read
    assert w.raced == 1


def test_a_read_a_crash_began_under_is_counted_not_raised():
    w = CrashWindow()

    def killed_meanwhile():
        with w.crash():
            pass
        _cut()

    assert w.read(killed_meanwhile) is None and w.raced == 1


def test_a_failed_read_outside_every_crash_is_raised():
    w = CrashWindow()
    with pytest.raises(http.client.IncompleteRead):
        w.read(_cut)
    with w.crash():
        pass
    with pytest.raises(ConnectionRefusedError):  # after the restart: the new worker's failure
        w.read(_refused)
    with w.crash(), pytest.raises(ValueError):  # not a scrape's error: raised, crash or not
        w.read(lambda: int("x"))
    assert w.raced == 0


def _rig(fail: set[str]):
    def metrics(role):
        if role in fail:
            _cut()
        return {("pp1q_slots_in_use", ()): 3.0}
    return SimpleNamespace(metrics=metrics)


def test_the_slot_sample_skips_only_a_worker_scrape_a_crash_cut():
    w, hwm = CrashWindow(), Counter()
    _sample_slots(_rig(set()), hwm, w)
    assert hwm == {"verifier": 3, "worker": 3}
    with w.crash():
        _sample_slots(_rig({"worker"}), Counter(), w)
        with pytest.raises(http.client.IncompleteRead):  # the verifier is never crashed
            _sample_slots(_rig({"verifier"}), Counter(), w)
    assert w.raced == 1
    with pytest.raises(http.client.IncompleteRead):
        _sample_slots(_rig({"worker"}), Counter(), w)


class _FailingRestart:
    """A rig whose worker does not start again after the soak's kill."""

    def __init__(self) -> None:
        self.killed = 0

    def crash_worker(self) -> None:
        self.killed += 1

    def restart_worker(self) -> None:
        raise RuntimeError("worker did not start ('address already in use')")

    def logs(self) -> str:
        return "--- worker\nOSError: [Errno 98] address already in use"


def test_a_failed_restart_is_the_soaks_error_not_a_refused_scrape():
    """A restart that fails leaves the crash under way (the worker's reads still counted,
    not raised as a bare ConnectionRefusedError), and the soak raises the chaos thread's
    own failure, naming it and showing the daemons' logs. Before, the thread died with a
    traceback on stderr and the soak failed on the next scrape's refusal."""
    from pp1q.tools.chaos.soak import SoakConfig, _chaos_thread, _raise_chaos_failure

    rig, w, failures = _FailingRestart(), CrashWindow(), []
    stop = SimpleNamespace(wait=lambda s: False)  # never told to stop: the crash comes first
    cfg = SoakConfig(seconds=1, crash_every_s=1e-9)
    _chaos_thread(failures, rig, cfg, __import__("random").Random(0), stop, [0], w, [],
                  threading.Event())
    assert rig.killed == 1 and len(failures) == 1
    assert w.begun == 1 and w.over == 0  # still under way: a worker read now is counted
    assert w.read(_refused) is None and w.raced == 1
    _raise_chaos_failure([], rig)  # nothing failed: nothing raised
    with pytest.raises(Exception, match="fault injection failed: RuntimeError: worker did "
                       "not start") as e:
        _raise_chaos_failure(failures, rig)
    assert type(e.value).__name__ == "ChaosError" and "address already in use" in str(e.value)


class _SlowRestart(_FailingRestart):
    """A rig whose worker restart is still under way when the soak ends."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def restart_worker(self) -> None:
        self.release.wait(30)
        raise RuntimeError("worker did not start (no port line within 60 s)")


def test_a_restart_still_under_way_at_the_soaks_end_is_the_soaks_error():
    """The soak's end waits for a restart as long as one can take (the launcher's start
    and stop bounds: it waited 30 s, half the start's 60), and a chaos thread still alive
    after that is a ChaosError: the soak went on to its report with the worker
    half-started, failing on a bare scrape error while the restart's own failure came
    later, unraised, and a worker started after ``rig.close()`` was left running."""
    from pp1q.runtime.launcher import STARTUP_TIMEOUT_S
    from pp1q.tools.chaos.soak import CHAOS_JOIN_S, SoakConfig, _chaos_thread, _stop_chaos

    assert CHAOS_JOIN_S > STARTUP_TIMEOUT_S
    rig, w, failures = _SlowRestart(), CrashWindow(), []
    stop = threading.Event()
    cfg = SoakConfig(seconds=1, crash_every_s=1e-9)
    chaos = threading.Thread(target=_chaos_thread,
                             args=(failures, rig, cfg, random.Random(0), stop, [0], w, [],
                                   threading.Event()),
                             daemon=True)
    chaos.start()
    try:
        deadline = time.monotonic() + 60  # bounded: a chaos thread that never kills fails
        while not rig.killed:
            assert time.monotonic() < deadline, "the chaos thread never killed the worker"
            time.sleep(0.001)
        with pytest.raises(Exception, match="did not stop within 0.05 s") as e:
            _stop_chaos(chaos, stop, failures, rig, join_s=0.05)
        assert type(e.value).__name__ == "ChaosError" and "address already in use" in str(e.value)
    finally:
        rig.release.set()
        chaos.join(5)
    assert len(failures) == 1  # then it failed: raised had the soak waited long enough
    with pytest.raises(Exception, match="fault injection failed: RuntimeError"):
        _stop_chaos(chaos, stop, failures, rig, join_s=0.05)
