"""Captures are readable while their daemon runs: records are flushed every loop tick,
``pp1q replay`` reads a live capture and ``--follow`` tails it. A client that leaves
mid-stream shows up in the capture as the RESET that freed its slot."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest
from daemon_harness import Pair, replay

from pp1q.runtime.launcher import daemon_env, pp1q_command

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

POLL = 400  # bounded polls of 50 ms


def _events(path) -> list[dict]:
    proc = replay(path, "--json", "--allow-truncated")
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _types(events) -> list[str]:
    return [e.get("type") for e in events if e.get("type")]


def test_live_capture_reads_and_follows(tmp_path):
    cap = tmp_path / "verifier.pp1qcap"
    pair = Pair(tmp_path, verifier_args=["--capture", str(cap)])
    follow = None
    try:
        client = pair.client()
        client.generate([1, 2], 6, seed=1)
        # the daemon is still running: every round it made is already in the file
        assert _types(_events(cap)).count("Commit") >= 1
        follow = subprocess.Popen(pp1q_command("replay", str(cap), "--follow", "--json"),
                                  stdout=subprocess.PIPE, text=True, env=daemon_env())
        for _ in range(2):
            client.generate([3, 4], 6, seed=2)
        seen = 0
        want = _types(_events(cap)).count("Commit")  # what the daemon has written by now
        for _ in range(10_000):  # bounded: one line per record
            line = follow.stdout.readline()
            assert line, "replay --follow ended"
            seen += json.loads(line).get("type") == "Commit"
            if seen == want:
                break
        assert seen == want
        assert follow.poll() is None  # still following
    finally:
        if follow is not None:
            follow.terminate()
            follow.wait(timeout=30)
        pair.close()


def test_a_client_leaving_mid_stream_resets_its_generation(tmp_path):
    cap = tmp_path / "verifier.pp1qcap"
    pair = Pair(tmp_path, verifier_args=["--capture", str(cap), "--slots", "1",
                                         "--target-delay-ms", "20"])
    try:
        body = json.dumps({"prompt": [1, 2], "max_tokens": 4096, "stream": True}).encode()
        sock = socket.create_connection(("127.0.0.1", int(pair.url.rsplit(":", 1)[1])))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        seen = b""
        for _ in range(100):
            seen += sock.recv(4096)
            if b'"token_ids":[' in seen:
                break
        sock.close()
        for _ in range(POLL):
            resets = [e for e in _events(cap) if e.get("type") == "Reset"]
            if resets:
                break
            time.sleep(0.05)
        assert [r["fields"]["reason"] for r in resets] == ["cancelled"]
    finally:
        pair.close()
