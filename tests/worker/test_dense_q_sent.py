"""A dense REPLY sends the FP32 q build_row wrote for the row (``DyadicRow.dense_q``) as
it is, no copy and no scatter: it arrives as the q that sampled, and a row whose q
disagrees with its support is caught.

The plant enters through the worker's drafting seam (a Proposer, as
tests/support/planted_worker.py does): rows built by build_row whose private FP32 q is
then replaced, so the bytes leave through the same path production takes (ZeroRow.fill
hands the row's own q to the frame). A lost count is refused by the verifier's row
checks (and by the worker's own, with check_outgoing); a valid but different q (every
value moved one id up) passes the row checks and is caught by the verifier's
re-derivation of each draft from its q and the proposal key
(pp1q.verifier.rounds.proposal_matches), the check the scheduler falls back on."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from worker_round import run_round

from pp1q.core import q_backend
from pp1q.core.errors import Reason
from pp1q.core.q import build_row, sample
from pp1q.core.rng import proposal_u24
from pp1q.core.verify import RoundKeys
from pp1q.verifier.rounds import proposal_matches
from pp1q.wire.events import ProposalFailed, ProposalReady
from pp1q.worker.drafting import Proposer

VOCAB, SLOTS, DEPTH = 3000, 2, 3
numba_missing = pytest.mark.skipif(q_backend.importlib.util.find_spec("numba") is None,
                                   reason="numba not installed (the fast extra)")
BACKENDS = ["numpy", pytest.param("numba", marks=numba_missing)]


def honest(q):
    return q


def one_count_lost(q):
    bad = q.copy()
    bad[int(np.argmax(bad))] -= np.float32(2.0 ** -24)  # still dyadic, mass 2^24 - 1
    bad.flags.writeable = False
    return bad


def moved_up_one_id(q):
    return np.roll(q, 1)  # a valid q (mass 2^24), not the one that sampled


class PlantedQ(Proposer):
    """Drafts as the worker leader does (token from the PROPOSAL-domain draw of the row),
    then swaps the row's FP32 q for ``plant(q)``."""

    def __init__(self, plant) -> None:
        super().__init__(None)
        self.plant = plant
        self.sent: dict[int, list] = {}

    def rows(self, step, prefix):
        rng = np.random.default_rng(100 + step.slot)
        for i in range(step.depth):
            row = build_row(rng.normal(size=VOCAB) * 2.0, temperature=step.temperature)
            token = sample(row, proposal_u24(step.seed, step.generation, step.round_id,
                                             step.first_position + i))
            object.__setattr__(row, "_dense_q", self.plant(row.dense_q()))
            self.sent.setdefault(step.slot, []).append((token, row))
            yield token, row


@pytest.fixture(params=BACKENDS)
def chosen(request, monkeypatch):
    """build_row's FP32 q writer and the verifier's checks on one backend (PP1Q_VALIDATE)."""
    monkeypatch.setenv(q_backend.ENV, request.param)
    monkeypatch.setattr(q_backend.CHOICE, "_chosen", None)
    assert q_backend.backend() == request.param
    return request.param


def _keys(e) -> RoundKeys:
    return RoundKeys(e.slot, e.generation, e.round_id, e.first_position)  # seed = slot


async def test_rows_sent_as_built_arrive_as_the_q_that_sampled(chosen):
    proposer = PlantedQ(honest)
    events, _ = await run_round(proposer, vocab=VOCAB, slots=SLOTS, depth=DEPTH, drains=True)
    ready = [e for e in events if isinstance(e, ProposalReady)]
    assert len(ready) == SLOTS, events
    for e in ready:
        sent = proposer.sent[e.slot]
        assert all(row.dense_q() is not None for _, row in sent)  # the path under test ran
        assert list(e.q_rows) == [row for _, row in sent]
        for reply, (_, row) in zip(e.replies, sent, strict=True):
            assert np.array_equal(reply.q.view(np.uint32), row.to_dense().view(np.uint32))
        assert proposal_matches(e.q_rows, e.draft_ids, _keys(e))


@pytest.mark.parametrize("check_outgoing", [False, True])
async def test_a_q_that_lost_a_count_is_refused(chosen, check_outgoing):
    events, _ = await run_round(PlantedQ(one_count_lost), vocab=VOCAB, slots=SLOTS,
                                depth=DEPTH, drains=True, check_outgoing=check_outgoing)
    failed = [e for e in events if isinstance(e, ProposalFailed)]
    assert not [e for e in events if isinstance(e, ProposalReady)]
    assert sorted(e.slot for e in failed) == list(range(SLOTS)), events
    if check_outgoing:  # the worker's own checks stop the row before it leaves: an abort
        assert {e.reason for e in failed} == {Reason.WORKER_ABORTED}
        assert all("wrong_mass" in e.detail for e in failed)
    else:  # the verifier's row checks refuse it on arrival
        assert {e.reason for e in failed} == {Reason.WRONG_MASS}


async def test_another_valid_q_fails_the_proposal_check(chosen):
    proposer = PlantedQ(moved_up_one_id)
    events, _ = await run_round(proposer, vocab=VOCAB, slots=SLOTS, depth=DEPTH, drains=True)
    ready = [e for e in events if isinstance(e, ProposalReady)]
    assert len(ready) == SLOTS, events  # every row check passes: a valid dyadic q
    for e in ready:
        assert list(e.q_rows) != [row for _, row in proposer.sent[e.slot]]
        assert not proposal_matches(e.q_rows, e.draft_ids, _keys(e))


async def test_the_worker_keeps_no_sent_q_past_the_send(chosen):
    """A row's q (517 KB at the real vocabulary of 129280) leaves in its frame without a
    copy: once a round's REPLYs have left, nothing on the worker (drafting, the reused
    rows, the connection) still holds any of them."""

    class Watched(Proposer):
        def __init__(self) -> None:
            super().__init__(None)
            self.refs = []

        def rows(self, step, prefix):
            rng = np.random.default_rng(step.slot)
            for _ in range(step.depth):
                row = build_row(rng.normal(size=VOCAB) * 2.0)
                self.refs.append(weakref.ref(row.dense_q()))
                yield sample(row, int(rng.integers(1 << 24))), row

    proposer = Watched()
    events, conn = await run_round(proposer, vocab=VOCAB, slots=SLOTS, depth=DEPTH,
                                   drains=True)  # conn: the worker, alive to the end
    assert len([e for e in events if isinstance(e, ProposalReady)]) == SLOTS
    gc.collect()
    assert len(proposer.refs) == SLOTS * DEPTH and len(conn.drafter._dense_rows) > 0
    assert [r for r in proposer.refs if r() is not None] == []
