"""A dense REPLY written from build_row's kept whole-vocabulary counts (no scatter) carries
the q that sampled, and a row whose kept counts disagree with its support is caught.

The plant enters through the worker's drafting seam (a Proposer, as
tests/support/planted_worker.py does): rows built by build_row whose private kept
counts are then replaced, so the bytes leave through the same ZeroRow path production
takes. A lost count is refused by the verifier's row checks (and by the worker's own,
with check_outgoing); a valid but different q (every count moved one id up) passes the
row checks and is caught by the verifier's re-derivation of each draft from its q and
the proposal key (pp1q.verifier.rounds.proposal_matches), the check the scheduler falls
back on."""

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


def honest(dense):
    return dense


def one_count_lost(dense):
    bad = dense.copy()
    bad[int(np.argmax(bad))] -= 1  # still dyadic, mass 2^24 - 1
    return bad


def moved_up_one_id(dense):
    return np.roll(dense, 1)  # a valid q (mass 2^24), not the one that sampled


class KeptCounts(Proposer):
    """Drafts as the worker leader does (token from the PROPOSAL-domain draw of the row),
    then swaps the row's kept dense counts for ``plant(kept)``."""

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
            object.__setattr__(row, "_dense", self.plant(row.kept_dense_counts()))
            self.sent.setdefault(step.slot, []).append((token, row))
            yield token, row


@pytest.fixture(params=BACKENDS)
def chosen(request, monkeypatch):
    """The ZeroRow's writer and the verifier's checks on one backend (PP1Q_VALIDATE)."""
    monkeypatch.setenv(q_backend.ENV, request.param)
    monkeypatch.setattr(q_backend.CHOICE, "_chosen", None)
    assert q_backend.backend() == request.param
    return request.param


def _keys(e) -> RoundKeys:
    return RoundKeys(e.slot, e.generation, e.round_id, e.first_position)  # seed = slot


async def test_rows_with_kept_counts_arrive_as_the_q_that_sampled(chosen):
    proposer = KeptCounts(honest)
    events, _ = await run_round(proposer, vocab=VOCAB, slots=SLOTS, depth=DEPTH, drains=True)
    ready = [e for e in events if isinstance(e, ProposalReady)]
    assert len(ready) == SLOTS, events
    for e in ready:
        sent = proposer.sent[e.slot]
        assert all(row.kept_dense_counts() is not None for _, row in sent)  # the new path ran
        assert list(e.q_rows) == [row for _, row in sent]
        for reply, (_, row) in zip(e.replies, sent, strict=True):
            assert np.array_equal(reply.q[:VOCAB].view(np.uint32), row.to_dense().view(np.uint32))
            assert not reply.q[VOCAB:].any()  # the padding
        assert proposal_matches(e.q_rows, e.draft_ids, _keys(e))


@pytest.mark.parametrize("check_outgoing", [False, True])
async def test_kept_counts_that_lost_a_count_are_refused(chosen, check_outgoing):
    events, _ = await run_round(KeptCounts(one_count_lost), vocab=VOCAB, slots=SLOTS,
                                depth=DEPTH, drains=True, check_outgoing=check_outgoing)
    failed = [e for e in events if isinstance(e, ProposalFailed)]
    assert not [e for e in events if isinstance(e, ProposalReady)]
    assert sorted(e.slot for e in failed) == list(range(SLOTS)), events
    if check_outgoing:  # the worker's own checks stop the row before it leaves: an abort
        assert {e.reason for e in failed} == {Reason.WORKER_ABORTED}
        assert all("wrong_mass" in e.detail for e in failed)
    else:  # the verifier's row checks refuse it on arrival
        assert {e.reason for e in failed} == {Reason.WRONG_MASS}


async def test_kept_counts_of_another_q_fail_the_proposal_check(chosen):
    proposer = KeptCounts(moved_up_one_id)
    events, _ = await run_round(proposer, vocab=VOCAB, slots=SLOTS, depth=DEPTH, drains=True)
    ready = [e for e in events if isinstance(e, ProposalReady)]
    assert len(ready) == SLOTS, events  # every row check passes: a valid dyadic q
    for e in ready:
        assert list(e.q_rows) != [row for _, row in proposer.sent[e.slot]]
        assert not proposal_matches(e.q_rows, e.draft_ids, _keys(e))


async def test_the_worker_keeps_no_kept_counts_past_the_send(chosen):
    """Kept counts are 517 KB a row: once a round's REPLYs have left, nothing on the
    worker (drafting, the reused rows, the connection) still holds any of them."""

    class Watched(Proposer):
        def __init__(self) -> None:
            super().__init__(None)
            self.refs = []

        def rows(self, step, prefix):
            rng = np.random.default_rng(step.slot)
            for _ in range(step.depth):
                row = build_row(rng.normal(size=VOCAB) * 2.0)
                self.refs.append(weakref.ref(row.kept_dense_counts()))
                yield sample(row, int(rng.integers(1 << 24))), row

    proposer = Watched()
    events, conn = await run_round(proposer, vocab=VOCAB, slots=SLOTS, depth=DEPTH,
                                   drains=True)  # conn: the worker, alive to the end
    assert len([e for e in events if isinstance(e, ProposalReady)]) == SLOTS
    gc.collect()
    assert len(proposer.refs) == SLOTS * DEPTH and len(conn.drafter._dense_rows) > 0
    assert [r for r in proposer.refs if r() is not None] == []
