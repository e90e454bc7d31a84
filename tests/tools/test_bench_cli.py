"""`pp1q bench` with a suite it does not know: exit status 2 and the known suites, on
stderr (stdout carries only figures, for a caller that keeps them)."""

from __future__ import annotations

from pp1q.cli import main


def test_an_unknown_suite_is_refused_on_stderr(capsys) -> None:
    assert main(["bench", "bogus"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "unknown suite(s): bogus; known: q, wire" in err
