"""Dense REPLYs leave the worker as (header, row) parts without a join copy (issue 13):
a row is filled again only once the transport holds none of it. A transport that keeps
references to everything it was given (as uvloop does after a partial write) must end up
with frames that validate on the verifier, byte for byte; one that drains at once lets
the worker reuse its rows. Driven through the adapter's own hooks, no socket."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from wire_helpers import HoldingTransport, feed_buffered

from pp1q.core.prefix import digest_of
from pp1q.core.q import build_row, sample
from pp1q.models.toy import ToySpec
from pp1q.runtime.metrics import Metrics
from pp1q.wire import Step, VerifierEndpoint, context_of
from pp1q.wire.events import ProposalReady
from pp1q.wire.session_config import DEFAULT_MAX_SUPPORT, verifier_config, worker_config
from pp1q.wire.sessions import SessionTable
from pp1q.worker.connection import WorkerConnection
from pp1q.worker.drafting import YIELD_AT_BYTES, Proposer

# a dense row (128 KiB) above YIELD_AT_BYTES: the drafter yields after each, so a loop
# tick holds one row per slot, as at the real vocabulary
VOCAB, SLOTS, DEPTH = 1 << 15, 4, 5
PREFIX = list(range(7))
ROUNDS_OF_THE_LOOP = 500  # bounded: the whole round takes a few dozen iterations


class Canned(Proposer):
    """Different rows for every slot and position (a reused row would show)."""

    def rows(self, step, prefix):
        rng = np.random.default_rng(step.slot)
        for _ in range(step.depth):
            row = build_row(rng.normal(size=VOCAB) * 2.0)
            yield sample(row, int(rng.integers(1 << 24))), row


@pytest.mark.parametrize("drains", [False, True])
async def test_dense_replies_without_a_join_arrive_intact(drains):
    spec = ToySpec(vocab=VOCAB)
    conn = WorkerConnection(worker_config(spec, (2,), DEFAULT_MAX_SUPPORT), SessionTable(),
                            Canned(None), Metrics("worker"))
    t = HoldingTransport(drains)
    conn.connection_made(t)
    v = VerifierEndpoint(verifier_config(spec, (2,), SLOTS, DEPTH, 32), session=9)
    feed_buffered(conn, v.hello())
    await asyncio.sleep(0)  # the answer leaves with the tick's writelines
    v.receive_data(t.take(), 0.0)
    for s in range(SLOTS):
        feed_buffered(conn, v.send(context_of(session=9, slot=s, generation=1, tokens=PREFIX,
                                      digest=digest_of(PREFIX))))
    feed_buffered(conn, b"".join(v.send(Step(
        session=9, slot=s, generation=1, round_id=1, last_committed=len(PREFIX) - 1,
        first_position=len(PREFIX), prefix_digest=digest_of(PREFIX), depth=DEPTH,
        temperature=1.0, top_k=0, context_version=0, seed=s), now=0.0) for s in range(SLOTS)))
    for _ in range(ROUNDS_OF_THE_LOOP):
        if not conn.drafter.tasks:
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0)  # the last tick's writelines
    events = v.receive_data(t.take(), 0.0)
    ready = [e for e in events if isinstance(e, ProposalReady)]
    assert len(ready) == SLOTS, events
    for e in ready:  # each row is the one its slot drafted, as the verifier parsed it
        want = list(Canned(None).rows(Step(
            session=9, slot=e.slot, generation=1, round_id=1, last_committed=0,
            first_position=1, prefix_digest=0, depth=DEPTH, temperature=1.0, top_k=0,
            context_version=0, seed=0), []))
        assert [int(x) for x in e.draft_ids] == [tok for tok, _ in want]
        assert list(e.q_rows) == [row for _, row in want]
    assert 4 * VOCAB > YIELD_AT_BYTES
    rows = len(conn.drafter._dense_rows)
    if drains:
        assert rows <= SLOTS  # drained between ticks: one tick's rows, reused
    else:
        assert rows == SLOTS * DEPTH  # every frame still held: a fresh row each
