"""The log limiter alone, on a clock the test steps: one line per kind per interval, the
next line let through says how many were held back, kinds are independent, and the
table of kinds stays within its cap."""

from __future__ import annotations

import logging

from pp1q.runtime.log_limit import LOG_INTERVAL_S, LogLimit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_interval_and_the_next_says_how_many_were_held_back():
    clock = Clock()
    limit = LogLimit(clock=clock)
    assert limit.check("bad_magic") == ""  # the first line of a kind: let through as is
    assert [limit.check("bad_magic") for _ in range(1234)] == [None] * 1234
    clock.now += LOG_INTERVAL_S - 0.001
    assert limit.check("bad_magic") is None  # still inside the interval
    clock.now += 0.001
    assert limit.check("bad_magic") == " (and 1,235 more like it in the last 10 s)"
    clock.now += LOG_INTERVAL_S
    assert limit.check("bad_magic") == ""  # none held back since: nothing to add


def test_kinds_are_independent():
    clock = Clock()
    limit = LogLimit(clock=clock)
    assert limit.check(("closing", "bad_magic")) == ""
    assert limit.check(("closing", "bad_magic")) is None
    assert limit.check(("closing", "hello_timeout")) == ""  # another reason: its own line
    assert limit.check(("older", "bad_magic")) == ""  # another site: its own line
    clock.now += LOG_INTERVAL_S
    assert limit.check(("closing", "hello_timeout")) == ""
    assert limit.check(("closing", "bad_magic")) == (
        " (and 1 more like it in the last 10 s)")


def test_the_table_of_kinds_is_capped():
    clock = Clock()
    limit = LogLimit(clock=clock, max_keys=4)
    for key in range(100):
        assert limit.check(key) == ""
    assert len(limit._kinds) == 4
    assert limit.check(99) is None  # the kinds let through last are still remembered
    assert limit.check(0) == ""  # the oldest was forgotten: a line again


def test_log_adds_the_count_to_the_line(caplog):
    clock = Clock()
    limit = LogLimit(clock=clock)
    log = logging.getLogger("pp1q.test.log_limit")
    with caplog.at_level(logging.INFO, logger=log.name):
        for i in range(5):
            limit.log(log, logging.WARNING, "k", "closing connection: %s", f"junk {i}")
        clock.now += 30
        assert limit.log(log, logging.WARNING, "k", "closing connection: %s", "junk 5")
        assert not limit.log(log, logging.WARNING, "k", "closing connection: %s", "junk 6")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "closing connection: junk 0"),
        (logging.WARNING, "closing connection: junk 5 (and 4 more like it in the last 30 s)"),
    ]


def test_log_keeps_the_traceback(caplog):
    limit = LogLimit(clock=Clock())
    log = logging.getLogger("pp1q.test.log_limit")
    with caplog.at_level(logging.ERROR, logger=log.name):
        try:
            raise RuntimeError("planted")
        except RuntimeError:
            limit.log(log, logging.ERROR, "k", "drafter failed on slot %d", 3, exc_info=True)
    [record] = caplog.records
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError
