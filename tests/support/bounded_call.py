"""A call that must not hang, run in a thread with a bounded join: a regression that
blocks (open() of a FIFO with no peer blocks for ever) fails the test instead of hanging
the run. Used by the operator-named file tests (tests/runtime/test_*_files.py)."""

from __future__ import annotations

import threading

JOIN_S = 10.0  # a refusal takes microseconds; a hang is what this bounds


class HungError(AssertionError):
    """The call did not return in time; ``thread`` is still in it."""

    def __init__(self, message: str, thread: threading.Thread) -> None:
        super().__init__(message)
        self.thread = thread


def start(fn, *args) -> tuple[threading.Thread, list]:
    """``fn(*args)`` running in a daemon thread; the list gets what it raised (None: it
    returned) once it ends."""
    out: list = []

    def run():
        try:
            fn(*args)
            out.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def returns(fn, *args, join_s: float = JOIN_S):
    """What ``fn(*args)`` raised (None: it returned), or a failure if it hung."""
    t, out = start(fn, *args)
    t.join(join_s)
    if t.is_alive():
        raise HungError(f"{getattr(fn, '__name__', fn)} hung on {args[0]}", t)
    return out[0]
