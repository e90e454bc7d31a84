"""The worker's write buffer bound (issue 13): after HELLO, drafting pauses only once a
loop tick's REPLYs (one per STEP the session may have outstanding) are queued unsent,
never beyond WRITE_HIGH_WATER_CAP; before, the 64 KiB default paused it after every
dense row. Driven through the adapter's own BufferedProtocol hooks, no socket."""

from __future__ import annotations

import msgspec
import pytest
from wire_helpers import feed_buffered

from pp1q.models.toy import ToySpec
from pp1q.runtime.metrics import Metrics
from pp1q.wire import VerifierEndpoint
from pp1q.wire.limits import Limits
from pp1q.wire.session_config import DEFAULT_MAX_SUPPORT, verifier_config, worker_config
from pp1q.wire.sessions import SessionTable
from pp1q.worker.connection import WRITE_HIGH_WATER_CAP, WorkerConnection, write_high_water
from pp1q.worker.drafting import Proposer


class FakeTransport:
    def __init__(self) -> None:
        self.written, self.high = [], None

    def writelines(self, data) -> None:
        self.written += list(data)

    def write(self, data) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        self.high = high


@pytest.mark.parametrize("vocab", [129280, 64])
async def test_the_mark_is_a_tick_of_replies_once_the_session_starts(vocab):
    spec = ToySpec(vocab=vocab)
    conn = WorkerConnection(worker_config(spec, (2,), DEFAULT_MAX_SUPPORT), SessionTable(),
                            Proposer(None), Metrics("worker"))
    t = FakeTransport()
    conn.connection_made(t)
    assert t.high is None  # no session yet: the transport's default stands
    v = VerifierEndpoint(verifier_config(spec, (2,), 4, 5, 32), session=5)
    feed_buffered(conn, v.hello())
    limits = conn.endpoint.limits
    assert t.high == write_high_water(limits) == limits.max_inflight * limits.max_payload
    if vocab == 129280:  # a dense row alone is 517 KB: far above the 64 KiB default
        assert t.high >= 4 * limits.dense_row_bytes > 64 * 1024


def test_the_mark_never_exceeds_its_cap():
    big = msgspec.structs.replace(Limits.make(vocab=1 << 24), max_inflight=1024)
    assert big.max_inflight * big.max_payload > WRITE_HIGH_WATER_CAP
    assert write_high_water(big) == WRITE_HIGH_WATER_CAP
