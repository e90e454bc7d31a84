"""The tests' forked runner (tests/support/forked.py): a failure in the child fails the
test here (a skip or xfail there is one here), a child that ends without a word fails
it, and a parent that stops reading early does not wait on its child."""

from __future__ import annotations

import os
import select
import signal
import time

import pytest
from forked import in_forked_child


def test_the_childs_value_and_its_failure_come_back():
    assert in_forked_child(lambda: 7) == 7
    with pytest.raises(pytest.fail.Exception, match="ZeroDivisionError"):
        in_forked_child(lambda: 1 / 0)


def test_a_skip_or_xfail_in_the_child_is_one_here():
    """pytest.skip (an importorskip, say) in the child skips the test, not fails it."""
    with pytest.raises(pytest.skip.Exception, match="no matplotlib here"):
        in_forked_child(lambda: pytest.skip("no matplotlib here"))
    with pytest.raises(pytest.xfail.Exception, match="known"):
        in_forked_child(lambda: pytest.xfail("known"))
    with pytest.raises(pytest.fail.Exception, match="it failed"):  # a fail stays a fail
        in_forked_child(lambda: pytest.fail("it failed"))


def test_a_child_killed_before_its_word_fails_the_test():
    with pytest.raises(pytest.fail.Exception, match="without a word"):
        in_forked_child(lambda: os.kill(os.getpid(), signal.SIGKILL))


def test_a_parent_that_stops_reading_kills_its_child(monkeypatch):
    """Its read interrupted (a signal to the parent alone, here a failing select): the
    child, which may never end, is killed, not waited for (it was: forever, for a hang)."""
    def interrupted(*_a):
        raise RuntimeError("the parent's read failed")

    monkeypatch.setattr(select, "select", interrupted)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError):
        in_forked_child(time.sleep, 30)
    assert time.monotonic() - t0 < 10
