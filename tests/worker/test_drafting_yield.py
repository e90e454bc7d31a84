"""When drafting yields to the loop (issue 13): only once it has run YIELD_AFTER_S since
it last did. A slow drafter (a real model) still yields after every row, so a RESET
that arrives mid-proposal stops it before the next row; a fast one sends a whole STEP
in one loop tick, and a RESET that arrives after its frames left is still safe: the
RESET invalidated the generation, so the verifier refuses the late REPLYs as stale and
the next generation drafts normally. A STEP's frames leave as soon as its COMPLETION is
written, not at the end of the loop tick (the verifier checks one proposal while the
next is drafted). Driven through the adapter's own hooks, no socket."""

from __future__ import annotations

from wire_helpers import feed_buffered
from worker_round import SESSION, Canned, connected, kinds, step_of, until

from pp1q.core.errors import Reason
from pp1q.wire import Reset
from pp1q.wire.events import Discarded, ProposalReady
from pp1q.wire.messages import Completion, Reply
from pp1q.wire.sizes import proposal_fits
from pp1q.worker.drafting import YIELD_AFTER_S

VOCAB, SLOTS, DEPTH, TOP_K = 64, 4, 5, 8


class Fast(Canned):
    """Rows built up front: drafting a STEP costs microseconds."""

    def __init__(self) -> None:
        super().__init__(VOCAB, DEPTH, TOP_K)


class Slow(Canned):
    """Each row takes longer than the yield budget, as a real model's does."""

    def __init__(self) -> None:
        super().__init__(VOCAB, DEPTH, TOP_K, row_seconds=2 * YIELD_AFTER_S)


async def _connected(proposer):
    conn, t, v = await connected(proposer, vocab=VOCAB, slots=SLOTS, depth=DEPTH, support=8,
                                 step_timeout=60.0)
    # these STEPs are answered row by row: their rows (5 x 8 entries x 8 bytes) exceed the
    # negotiated row bound (a dense row of 64 entries); test_drafting_proposal has the others
    assert not proposal_fits(_step(1), v.limits)
    return conn, t, v


def _step(generation: int, slot: int = 0):
    return step_of(slot, DEPTH, top_k=TOP_K, generation=generation)


def _reset(generation: int) -> Reset:
    return Reset(session=SESSION, slot=0, generation=generation, reason=Reason.STEP_TIMEOUT)


async def test_a_slow_drafter_stops_at_a_reset_between_rows():
    conn, t, v = await _connected(Slow())
    feed_buffered(conn, v.send(_step(1), now=0.0))
    await until(lambda: t.held)  # the first row left; drafting yielded after it
    assert conn.drafter.tasks  # still drafting: the RESET comes mid-proposal
    feed_buffered(conn, v.send(_reset(1)))
    await until(lambda: not conn.drafter.tasks)
    sent = kinds(t.take())
    assert Completion not in sent and 1 <= sent.count(Reply) < DEPTH, sent


async def test_a_fast_drafter_sends_a_whole_step_and_a_late_reset_is_still_safe():
    conn, t, v = await _connected(Fast())
    feed_buffered(conn, v.send(_step(1), now=0.0))
    await until(lambda: not conn.drafter.tasks)
    late = t.take()  # every frame of the step left before the RESET arrived
    assert kinds(late) == [Reply] * DEPTH + [Completion]
    feed_buffered(conn, v.send(_reset(1)))  # the verifier gave up before reading them
    events = v.receive_data(late, 0.0)
    assert len(events) == DEPTH + 1 and all(
        isinstance(e, Discarded) and e.reason == Reason.STALE_GENERATION for e in events)
    # the next generation drafts from the same committed prefix and is consumed
    feed_buffered(conn, v.send(_step(2), now=0.0))
    await until(lambda: not conn.drafter.tasks)
    [ready] = v.receive_data(t.take(), 0.0)
    assert isinstance(ready, ProposalReady) and ready.generation == 2
    assert list(ready.draft_ids) == [tok for tok, _ in Fast().chain]


async def test_a_reset_read_with_its_step_sends_nothing():
    conn, t, v = await _connected(Fast())
    feed_buffered(conn, v.send(_step(1), now=0.0) + v.send(_reset(1)))
    await until(lambda: not conn.drafter.tasks)
    assert t.take() == b""


async def test_a_finished_proposal_leaves_at_once():
    conn, t, v = await _connected(Fast())
    feed_buffered(conn, b"".join(v.send(_step(1, slot), now=0.0) for slot in range(SLOTS)))
    await until(lambda: not conn.drafter.tasks)
    writes = [kinds(w) for w in t.writes]
    assert sum(k.count(Completion) for k in writes) == SLOTS
    for k in writes:  # a COMPLETION is the last frame of its write: nothing waited behind it
        assert Completion not in k[:-1], writes
    ready = v.receive_data(t.take(), 0.0)
    assert sorted(e.slot for e in ready if isinstance(e, ProposalReady)) == list(range(SLOTS))
