"""A sparse STEP whose rows fit one frame (``sizes.proposal_fits``) leaves the worker as
one PROPOSAL (wire v2 revision 3), drafted whole; one whose rows do not leaves row by
row (REPLY ... COMPLETION). A drafter that fails mid-proposal aborts it: one ABORTED
COMPLETION, nothing of its rows. A RESET between rows stops it with nothing sent, and
one read after the PROPOSAL left is still safe (the verifier discards it as stale).
Driven through the adapter's own hooks (worker_round), no socket."""

from __future__ import annotations

import asyncio

import pytest
from wire_helpers import feed_buffered
from worker_round import SESSION, Canned, connected, kinds, step_of, until

from pp1q.core.errors import DistributionError, Reason
from pp1q.wire import Reset
from pp1q.wire.decoder import FrameDecoder
from pp1q.wire.events import Discarded, ProposalFailed, ProposalReady
from pp1q.wire.messages import Completion, MsgType, Proposal, Reply, Status
from pp1q.wire.sizes import proposal_fits
from pp1q.worker.drafting import YIELD_AFTER_S

# vocab 64, support 8: the negotiated row bound is the dense row, 64 x 4 = 256 bytes
VOCAB, SLOTS, DEPTH = 64, 4, 5
FITS = 4  # 5 rows x 4 entries x 8 bytes = 160 <= 256: one PROPOSAL
TOO_WIDE = 8  # 5 x 8 x 8 = 320 > 256: row by row


async def _connected(proposer, check_outgoing: bool = False):
    return await connected(proposer, vocab=VOCAB, slots=SLOTS, depth=DEPTH, support=8,
                           step_timeout=60.0, check_outgoing=check_outgoing)


def _reset(generation: int) -> Reset:
    return Reset(session=SESSION, slot=0, generation=generation, reason=Reason.STEP_TIMEOUT)


async def _drafted(proposer, top_k: int, check_outgoing: bool = False):
    """One STEP of ``top_k`` drafted to the end: (the bytes sent, the verifier, the
    connection)."""
    conn, t, v = await _connected(proposer, check_outgoing)
    st = step_of(0, DEPTH, top_k=top_k)
    assert proposal_fits(st, v.limits) is (top_k == FITS)
    assert v.limits == conn.endpoint.limits  # both ends decide alike
    feed_buffered(conn, v.send(st, now=0.0))
    await until(lambda: not conn.drafter.tasks)
    return t.take(), v, conn


@pytest.mark.parametrize("top_k,sent", [(FITS, [Proposal]),
                                        (TOO_WIDE, [Reply] * DEPTH + [Completion])],
                         ids=["fits one frame", "row by row"])
async def test_a_sparse_step_leaves_whole_exactly_when_it_fits_one_frame(top_k, sent):
    proposer = Canned(VOCAB, DEPTH, top_k)
    data, v, _ = await _drafted(proposer, top_k)
    assert kinds(data) == sent
    [ready] = v.receive_data(data, 0.0)
    assert isinstance(ready, ProposalReady)
    assert list(ready.draft_ids) == [tok for tok, _ in proposer.chain]
    assert all(a == b for a, (_, b) in zip(ready.q_rows, proposer.chain, strict=True))


async def test_a_proposal_is_the_same_frame_with_the_workers_own_checks_on_or_off():
    out = [(await _drafted(Canned(VOCAB, DEPTH, FITS), FITS, check_outgoing=on))[0]
           for on in (False, True)]
    assert out[0] == out[1] and kinds(out[0]) == [Proposal]


class _Failing(Canned):
    """A drafter that fails after two rows of a STEP (through the Proposer seam)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(VOCAB, DEPTH, FITS)
        self.error = error

    def rows(self, step, prefix):
        for i, drawn in enumerate(super().rows(step, prefix)):
            if i == 2:
                raise self.error
            yield drawn


@pytest.mark.parametrize("error", [
    DistributionError(Reason.ZERO_MASS, "planted: the drafter's row has no mass"),
    RuntimeError("planted: a real model's failure (CUDA out of memory)"),
], ids=["closed-set error", "any other exception"])
async def test_a_drafter_failing_mid_proposal_sends_one_aborted_completion(error):
    data, v, conn = await _drafted(_Failing(error), FITS)
    frames = FrameDecoder().feed(data)
    assert [type(f) for f in frames] == [Completion]  # nothing of the two rows drafted
    [done] = frames
    assert done.status == Status.ABORTED
    assert (done.rows, done.reply_bytes) == (0, 0)
    [failed] = v.receive_data(data, 0.0)
    assert isinstance(failed, ProposalFailed) and failed.reason is Reason.WORKER_ABORTED
    assert failed.detail == done.reason
    assert conn.metrics.value("pp1q_drafting_aborts_total", reason=done.reason) == 1


async def test_a_reset_between_rows_of_a_fitting_step_sends_nothing():
    proposer = Canned(VOCAB, DEPTH, FITS, row_seconds=2 * YIELD_AFTER_S)  # a real model's pace
    conn, t, v = await _connected(proposer)
    feed_buffered(conn, v.send(step_of(0, DEPTH, top_k=FITS), now=0.0))
    await until(lambda: proposer.drafted)  # a row drafted, and drafting yielded after it
    assert conn.drafter.tasks and proposer.drafted < DEPTH  # the RESET comes mid-proposal
    feed_buffered(conn, v.send(_reset(1)))
    await until(lambda: not conn.drafter.tasks)
    assert t.take() == b"" and proposer.drafted < DEPTH


async def test_a_reset_read_with_a_fitting_step_sends_nothing():
    conn, t, v = await _connected(Canned(VOCAB, DEPTH, FITS))
    feed_buffered(conn, v.send(step_of(0, DEPTH, top_k=FITS), now=0.0) + v.send(_reset(1)))
    await until(lambda: not conn.drafter.tasks)
    assert t.take() == b""


async def test_a_late_reset_after_the_proposal_left_is_still_safe():
    proposer = Canned(VOCAB, DEPTH, FITS)
    conn, t, v = await _connected(proposer)
    feed_buffered(conn, v.send(step_of(0, DEPTH, top_k=FITS), now=0.0))
    await until(lambda: not conn.drafter.tasks)
    late = t.take()  # the whole proposal left before the RESET arrived
    feed_buffered(conn, v.send(_reset(1)))  # the verifier gave up before reading it
    assert v.receive_data(late, 0.0) == [
        Discarded(0, 1, 1, MsgType.PROPOSAL, Reason.STALE_GENERATION, len(late))]
    # the next generation drafts from the same committed prefix and is consumed
    feed_buffered(conn, v.send(step_of(0, DEPTH, top_k=FITS, generation=2), now=0.0))
    await until(lambda: not conn.drafter.tasks)
    [ready] = v.receive_data(t.take(), 0.0)
    assert isinstance(ready, ProposalReady) and ready.generation == 2
    assert list(ready.draft_ids) == [tok for tok, _ in proposer.chain]


async def test_each_proposal_leaves_in_a_write_of_its_own_with_no_flush_left_for_the_tick(
        monkeypatch):
    """A whole PROPOSAL is handed to the transport as its last row is drafted, not queued
    for the loop tick's end: no tick-end flush is scheduled for it (one ran for each, and
    found nothing left to write: a loop callback a step for nothing, issue 13)."""
    conn, t, v = await _connected(Canned(VOCAB, DEPTH, FITS))
    loop = asyncio.get_running_loop()
    scheduled, call_soon = [], loop.call_soon

    def counting(callback, *args, **kwargs):
        scheduled.append(callback)
        return call_soon(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon", counting)
    before = len(t.writes)
    feed_buffered(conn, b"".join(v.send(step_of(s, DEPTH, top_k=FITS), now=0.0)
                                 for s in range(SLOTS)))
    await until(lambda: not conn.drafter.tasks)
    assert [kinds(w) for w in t.writes[before:]] == [[Proposal]] * SLOTS
    assert conn._flush_out not in scheduled
    ready = v.receive_data(t.take(), 0.0)
    assert [type(e) for e in ready] == [ProposalReady] * SLOTS
