"""`pp1q bench round`'s daemon paths run end to end: every round validates, decides and
commits (a fallback raises), one batch and two batches in flight. Timings are not
asserted (speed lives in the benchmark); what could fail is the path itself."""

import asyncio

import pytest

from pp1q.tools.bench import round as bench_round

pytestmark = pytest.mark.daemons


def test_one_batch_and_two_batches_in_flight_commit_every_round() -> None:
    peer = bench_round._Peer("ours", "sparse")
    try:
        one = asyncio.run(bench_round._ours(peer.port, "sparse", 3))
    finally:
        peer.close()
    peer = bench_round._Peer("ours", "sparse")
    try:
        two = asyncio.run(bench_round._ours(peer.port, "sparse", 3, batches=2))
    finally:
        peer.close()
    assert all(ms > 0 for ms in (*one, *two))
    assert one[1] >= one[0]  # the decision and COMMITs come after the transport
