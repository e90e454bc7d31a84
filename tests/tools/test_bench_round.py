"""`pp1q bench round`'s daemon paths run end to end: every round validates, decides and
commits (a fallback raises), one batch and two batches in flight. Timings are not
asserted (speed lives in the benchmark); what could fail is the path itself."""

import asyncio

import pytest

from pp1q.tools.bench import core_round, loop_client, peer_clients, round_peer
from pp1q.tools.bench import round as bench_round

pytestmark = pytest.mark.daemons


def test_one_batch_and_two_batches_in_flight_commit_every_round() -> None:
    peer = round_peer.Peer("ours", "sparse")
    try:
        one = asyncio.run(bench_round._ours(peer.port, "sparse", 3))
    finally:
        peer.close()
    peer = round_peer.Peer("ours", "sparse")
    try:
        two = asyncio.run(bench_round._ours(peer.port, "sparse", 3, batches=2))
    finally:
        peer.close()
    assert all(ms > 0 for ms in (*one, *two))
    assert one[1] >= one[0]  # the decision and COMMITs come after the transport


def test_side_by_side_runs_one_raw_round_before_each_round_of_ours(monkeypatch) -> None:
    # every round of ours gets its raw round (time_side_by_side's claim: the medians
    # come from rounds taken in turn); a raw client that never ran would still return
    # medians from time_ours, so count the raw rounds through the client's own seam
    calls = []
    real_round = peer_clients.RawClient.round

    def counted(self) -> float:
        calls.append(self)
        return real_round(self)

    monkeypatch.setattr(peer_clients.RawClient, "round", counted)
    t = bench_round.time_side_by_side("sparse", 4)
    assert len(calls) == 4 and len(set(calls)) == 1  # one connection, a round per round
    # no pyzmq column unless asked for; each round's ratio to the raw round before it
    assert set(t) == {"raw", "ours", "full", "ours_iqr", "full_iqr"}
    assert all(t[k] > 0 for k in ("raw", "ours", "full"))
    assert t["full"] >= t["ours"]
    for name in ("ours", "full"):
        q1, q3 = t[f"{name}_iqr"]
        assert 0 < q1 <= q3


def test_between_needs_one_batch() -> None:
    with pytest.raises(ValueError):
        asyncio.run(bench_round._ours(1, "sparse", 1, batches=2, between=lambda: None))


def test_side_by_side_runs_a_loop_round_before_each_round_of_ours(monkeypatch) -> None:
    calls = []
    real_round = loop_client.LoopClient.round

    def counted(self) -> float:
        calls.append(self)
        return real_round(self)  # compares every round's bytes with the frames sent

    monkeypatch.setattr(loop_client.LoopClient, "round", counted)
    t = bench_round.time_side_by_side("sparse", 3, with_loop=True)
    assert len(calls) == 3 and len(set(calls)) == 1
    assert t["loop"] > 0 and t["raw"] > 0
    assert "loop round" not in loop_client.describe_loop(t)  # a line, not an error
    assert f"{t['loop']:.3f} ms" in loop_client.describe_loop(t)


def _refused_round(monkeypatch, change, match: str) -> None:
    """A loop client expecting the peer's frames with ``change`` made to the last one
    (head, payload) -> (head, payload) refuses its first round with ``match``."""
    real = loop_client.frames

    def frames(form: str):
        parts = real(form)
        return parts[:-1] + [change(*parts[-1])]

    monkeypatch.setattr(loop_client, "frames", frames)
    client = loop_client.LoopClient("sparse")
    try:
        with pytest.raises(RuntimeError, match=match):
            client.round()
    finally:
        client.close()


def test_loop_client_refuses_a_round_whose_bytes_differ(monkeypatch) -> None:
    # the client expects one byte other than the peer sends (same length): the round
    # completes, and its bytes are refused
    _refused_round(monkeypatch, lambda h, p: (h, p[:-1] + bytes([p[-1] ^ 1])), "differ")


def test_loop_client_gives_up_on_a_round_that_never_completes(monkeypatch) -> None:
    # the client waits for a byte the peer never sends: bounded by ROUND_TIMEOUT_S
    monkeypatch.setattr(loop_client, "ROUND_TIMEOUT_S", 0.5)
    _refused_round(monkeypatch, lambda h, p: (h, p + b"\0"), "no answer")


def test_one_process_round_serves_the_worker_adapter_on_the_bench_loop() -> None:
    # both adapters on one loop: every round validates, decides and commits (a fallback
    # raises in _batch_rounds), and the line reads the core's phases it is given
    ours, full = bench_round.time_one_process("sparse", 3)
    assert 0 < ours <= full
    t = {"steps": 0.1, "read_steps": 0.2, "rows": 0.3, "read_rows": 0.4, "decide": 9.0}
    line = core_round.describe_one_process(ours, full, t)
    assert f"{ours:.3f} ms a round" in line and "summed 1.000 ms" in line
