"""``run_on_pair`` (the end every ``pp1q demo`` path shares) with stand-in daemons: the
log folder, which holds the pair's draw secret, is removed after a clean run or Ctrl-C
and kept, with its path printed, after a failure."""

from __future__ import annotations

import pytest

from pp1q.tools.demo_pair import run_on_pair


class _Daemon:
    def __init__(self, role: str) -> None:
        self.role, self.log_path, self.stopped = role, f"{role}.log", False

    def alive(self) -> bool:
        return not self.stopped

    def log_tail(self) -> str:
        return "last line"

    def stop(self) -> None:
        self.stopped = True


def _pair():
    return _Daemon("worker"), _Daemon("verifier"), "http://127.0.0.1:1"


def _body_raising(exc):
    def body(worker, verifier, url):
        raise exc
    return body


def test_a_clean_run_removes_the_log_folder(tmp_path):
    logs = tmp_path / "pp1q-demo-x"
    logs.mkdir()
    (logs / "draw.secret").write_text("00" * 16)
    daemons = []

    def start():
        pair = _pair()
        daemons.extend(pair[:2])
        return pair

    assert run_on_pair(str(logs), start, lambda w, v, u: None, False, str) == 0
    assert not logs.exists()
    assert all(d.stopped for d in daemons)


@pytest.mark.parametrize("exc, status", [(RuntimeError("worker exited"), 1),
                                         (KeyboardInterrupt(), 130)])
def test_a_failure_keeps_the_logs_and_says_where_ctrl_c_does_not(tmp_path, capsys, exc,
                                                                   status):
    logs = tmp_path / "pp1q-demo-y"
    logs.mkdir()
    assert run_on_pair(str(logs), _pair, _body_raising(exc), False, str) == status
    err = capsys.readouterr().err
    if status == 1:
        assert logs.exists() and f"daemon logs kept in {logs}" in err
        assert "--- worker log (worker.log), last lines:\nlast line" in err
    else:
        assert not logs.exists()


def test_a_daemon_that_stops_under_keep_is_a_failure(tmp_path, capsys):
    logs = tmp_path / "pp1q-demo-z"
    logs.mkdir()

    def body(worker, verifier, url):
        verifier.stopped = True  # died while the demo holds the pair up

    assert run_on_pair(str(logs), _pair, body, True, lambda url: "try") == 1
    assert logs.exists()
    assert "the verifier stopped" in capsys.readouterr().err


def test_the_exactness_verdict_with_one_bin_says_there_is_nothing_to_test(capsys):
    from pp1q.tools.demo_pair import report_exactness

    h = report_exactness(([7] * 12, [7] * 12))  # every draw the same token: zero df
    out = capsys.readouterr().out
    assert h.df == 0 and "nothing to test" in out and "differ" not in out
    report_exactness(([1] * 40 + [2] * 40, [1] * 80))  # two bins, clearly different
    assert "the samples differ" in capsys.readouterr().out
