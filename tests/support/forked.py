"""A test run in a forked child of the test process, as the child's only thread.

Why: a measure of the whole process counts every thread's part of it. tracemalloc's
traced and peak bytes count the allocations of every thread, so a thread an earlier test
on the same xdist worker left running (a server's connection thread winding down, say)
is counted as the test's own: a flood bounded at 16 KiB retained read 113-188 KB that
way under load. A forked child holds only the thread that forked it, with everything
imported and built so far, so the same measure there is the test's alone, and the test
asserts what it asserted before, as strictly.

The child runs nothing but the test: no output of its own (a failure comes back through
a pipe as its traceback and fails the test here, pytest.fail), and it leaves by
os._exit, never through the parent's exit handlers or buffers. A child that never ends
(a lock another thread held at the fork, say) is killed after CHILD_LIMIT_S and fails
the test rather than hanging the run; so is a child whose parent stops reading early (a
signal to the parent alone), rather than waited for.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import select
import signal
import threading
import time
import traceback
import warnings

import pytest

CHILD_LIMIT_S = 300.0  # the tests forked here take seconds; this bounds a hang only


def forked(test):
    """``test`` (a test function; its fixtures and parameters as they were) run in a
    forked child, its failure reported here."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        return in_forked_child(test, *args, **kwargs)

    return run


def assert_alone() -> None:
    """Fails unless the calling thread is the process's only one (in a forked child, it
    is): a measure that counts every thread is then the caller's own."""
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    assert not others, f"measured beside other threads {others}: run the test @forked"


def in_forked_child(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a forked child: what it returned (pickled back), or,
    where it raised, a test failure carrying the child's traceback."""
    r, w = os.pipe()
    with warnings.catch_warnings():
        # 3.12's warning that a multi-threaded process forks: the child touches nothing
        # another thread may have held (it writes only to its pipe, leaves by _exit)
        warnings.filterwarnings("ignore", "This process .* is multi-threaded",
                                DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; it never returns
        _child(r, w, fn, args, kwargs)
    os.close(w)
    data = None
    try:
        data = _read_to_end(r, pid)
    finally:
        os.close(r)
        if data is None:  # the parent stopped reading (interrupted): the child may never end
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if not data:
        pytest.fail("the forked child ended without a word", pytrace=False)
    how, value = pickle.loads(data)
    if how == "skip":  # the child's pytest.skip: a skip here too, not a failure
        pytest.skip(value)
    if how == "xfail":
        pytest.xfail(value)
    if how == "raised":
        pytest.fail(f"in the forked child:\n{value}", pytrace=False)
    return value


def _child(r: int, w: int, fn, args, kwargs) -> None:
    try:
        os.close(r)
        try:
            out = pickle.dumps(("returned", fn(*args, **kwargs)))
        except pytest.skip.Exception as e:
            out = pickle.dumps(("skip", e.msg))
        except pytest.xfail.Exception as e:
            out = pickle.dumps(("xfail", e.msg))
        except BaseException:  # noqa: BLE001 - handed to the parent
            out = pickle.dumps(("raised", traceback.format_exc()))
        view = memoryview(out)
        while view:
            view = view[os.write(w, view):]
    finally:
        os._exit(0)


def _read_to_end(r: int, pid: int) -> bytes:
    chunks = []
    deadline = time.monotonic() + CHILD_LIMIT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([r], [], [], left)[0]:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"the forked child ran past {CHILD_LIMIT_S:g} s", pytrace=False)
        chunk = os.read(r, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
