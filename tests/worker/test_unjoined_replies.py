"""Dense REPLYs leave the worker as (header, row) parts without a join copy (issue 13):
a row is filled again only once the transport holds none of it. A transport that keeps
references to everything it was given (as uvloop does after a partial write) must end up
with frames that validate on the verifier, byte for byte; one that drains at once lets
the worker reuse its rows. Driven through the adapter's own hooks, no socket."""

from __future__ import annotations

import numpy as np
import pytest
from worker_round import run_round, step_of

from pp1q.core.q import build_row, sample
from pp1q.wire.events import ProposalReady
from pp1q.worker.drafting import YIELD_AT_BYTES, Proposer

# a dense row (128 KiB) above YIELD_AT_BYTES: the drafter yields after each, so a loop
# tick holds one row per slot, as at the real vocabulary
VOCAB, SLOTS, DEPTH = 1 << 15, 4, 5


class Canned(Proposer):
    """Different rows for every slot and position (a reused row would show)."""

    def rows(self, step, prefix):
        rng = np.random.default_rng(step.slot)
        for _ in range(step.depth):
            row = build_row(rng.normal(size=VOCAB) * 2.0)
            yield sample(row, int(rng.integers(1 << 24))), row


@pytest.mark.parametrize("drains", [False, True])
async def test_dense_replies_without_a_join_arrive_intact(drains):
    events, conn = await run_round(Canned(None), vocab=VOCAB, slots=SLOTS, depth=DEPTH,
                                   drains=drains)
    ready = [e for e in events if isinstance(e, ProposalReady)]
    assert len(ready) == SLOTS, events
    for e in ready:  # each row is the one its slot drafted, as the verifier parsed it
        want = list(Canned(None).rows(step_of(e.slot, DEPTH), []))
        assert [int(x) for x in e.draft_ids] == [tok for tok, _ in want]
        assert list(e.q_rows) == [row for _, row in want]
    assert 4 * VOCAB > YIELD_AT_BYTES
    rows = len(conn.drafter._dense_rows)
    if drains:
        assert rows <= SLOTS  # drained between ticks: one tick's rows, reused
    else:
        assert rows == SLOTS * DEPTH  # every frame still held: a fresh row each
