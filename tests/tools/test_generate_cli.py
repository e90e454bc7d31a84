"""``pp1q generate`` without a verifier: the line an operator reads names the URL and
says it is unreachable (no daemon needed)."""

import socket

from pp1q.cli import main


def _dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_an_unreachable_verifier_is_one_plain_line(capsys):
    dead = _dead_url()
    code = main(["generate", "--url", dead, "--prompt", "1,2"])
    err = capsys.readouterr().err
    assert code == 1
    # was "pp1q generate: 0 unreachable: ...": a status 0 that no server sent
    assert err.startswith(f"pp1q generate: unreachable: {dead}: "), err
    assert err.count("\n") == 1
