"""The worker prefills a STEP's long committed prefix in chunks of PREFILL_CHUNK ids
(``Proposer.prepare``: EngineProposer opens the drafter's request with the first chunk
and extends it a chunk at a time), and StepDrafter gives the event loop back after each
chunk (a timer, so what the chunk kept waiting runs before the next one): another
slot's STEP is drafted, and any input read, between two chunks instead of after the
whole prompt. A RESET mid-prefill stops it after the chunk in hand, and
the next STEP resumes it with ``extend`` where it stopped, not with a reopen.

The drafter here is the toy's engine behind the Drafter seam, every prompt call and row
logged in one list with the ticks of a task that turns with the loop, so the log shows
what ran between two chunks. Planted variants: a proposer whose ``prepare`` yields
nothing (the whole prefill in one loop tick, in chunks), one that prefills the whole
prompt in one call, one that reopens an interrupted prefill, and a sleep(0) between two
chunks (a timer's task then waits three): each is rejected."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from draft_prefill import (
    CHUNKS,
    DEPTH,
    LONG,
    PROMPT_CALLS,
    TICK_S,
    TOP_K,
    VOCAB,
    Logged,
    Slow,
    chain,
    check_interleaved,
    prompt_calls,
    ticker,
)
from wire_helpers import feed_buffered
from worker_round import PREFIX, SESSION, connected, kinds, step_of, until

from pp1q.core.errors import Reason
from pp1q.models.engine import PREFILL_CHUNK
from pp1q.models.toy import ToyDrafter, ToySpec
from pp1q.models.toy_engine import ToyDrafterEngine
from pp1q.wire import Reset
from pp1q.wire.events import ProposalReady
from pp1q.wire.messages import Completion, Reply
from pp1q.worker import drafting, engine_proposer
from pp1q.worker.engine_proposer import EngineProposer


class NoYield(EngineProposer):
    """Planted: the chunks prepared without a yield between them (one loop tick)."""

    def prepare(self, step, prefix):
        for _ in super().prepare(step, prefix):
            pass
        return iter(())


class Whole(EngineProposer):
    """Planted: the whole prompt in one ``open``, as before the chunking."""

    def prepare(self, step, prefix):
        key = (step.session, step.slot)
        self.drafter.close(key)
        self.drafter.open(key, list(prefix))
        self._held[key] = (list(prefix), [])
        yield len(prefix)


class Reopens(EngineProposer):
    """Planted: an interrupted prefill is closed and started over, not extended."""

    def prepare(self, step, prefix):
        key = (step.session, step.slot)
        held = self._held.get(key)
        if held is not None and len(prefix) - len(held[0]) > 1 and not held[1]:
            del self._held[key]
            self.drafter.close(key)
        yield from super().prepare(step, prefix)


async def _drafted(cls, engine=Logged, tick_s: float = 0.0) -> tuple[list, list]:
    """Slot 0's STEP on LONG and slot 1's on PREFIX, read together; the log and the
    verifier's events."""
    log: list = []
    conn, t, v = await connected(cls(engine(log)), vocab=VOCAB, slots=2, depth=DEPTH,
                                 support=8, prefixes={0: LONG}, step_timeout=60.0)
    ticking = asyncio.get_running_loop().create_task(ticker(log, tick_s))
    feed_buffered(conn, v.send(step_of(0, DEPTH, top_k=TOP_K, prefix=LONG), now=0.0)
                  + v.send(step_of(1, DEPTH, top_k=TOP_K), now=0.0))
    await until(lambda: not conn.drafter.tasks)
    ticking.cancel()
    return log, v.receive_data(t.take(), 0.0)


def _check_neighbour_first(log: list) -> None:
    """Slot 1's rows were all drafted before slot 0's prefill ended."""
    last_chunk = max(i for i, (what, r, _) in enumerate(log)
                     if r == (SESSION, 0) and what in PROMPT_CALLS)
    rows = [i for i, (what, r, _) in enumerate(log) if r == (SESSION, 1) and what == "row"]
    assert len(rows) == DEPTH and max(rows) < last_chunk, (rows, last_chunk)


async def test_a_long_prompt_is_prefilled_in_chunks_with_the_loop_turning_between():
    log, events = await _drafted(EngineProposer)
    check_interleaved(log, (SESSION, 0), LONG)
    assert len(prompt_calls(log, (SESSION, 0))) == CHUNKS
    _check_neighbour_first(log)
    ready = {e.slot: list(e.draft_ids) for e in events if isinstance(e, ProposalReady)}
    assert ready == {0: chain(step_of(0, DEPTH, top_k=TOP_K, prefix=LONG), LONG),
                     1: chain(step_of(1, DEPTH, top_k=TOP_K), PREFIX)}


@pytest.mark.parametrize("cls", [NoYield, Whole], ids=["planted-no-yield", "planted-whole"])
async def test_planted_prefills_on_one_loop_tick_are_rejected(cls):
    log, events = await _drafted(cls)
    assert sorted(e.slot for e in events if isinstance(e, ProposalReady)) == [0, 1]
    with pytest.raises(AssertionError):
        check_interleaved(log, (SESSION, 0), LONG)
    with pytest.raises(AssertionError):
        _check_neighbour_first(log)


@pytest.mark.parametrize("pause", [drafting.PIECE_PAUSE_S, 0.0],
                         ids=["timer", "planted-sleep-0"])
async def test_a_timer_due_during_a_chunk_runs_before_the_next_chunk(pause, monkeypatch):
    # after sleep(0) the drafting task is ahead of what the chunk kept waiting in the
    # ready queue: the next chunk ran first, and a timer's task waited three chunks
    monkeypatch.setattr(drafting, "PIECE_PAUSE_S", pause)
    log, events = await _drafted(EngineProposer, Slow, tick_s=TICK_S)
    assert sorted(e.slot for e in events if isinstance(e, ProposalReady)) == [0, 1]
    if pause:
        check_interleaved(log, (SESSION, 0), LONG)
        return
    with pytest.raises(AssertionError, match="no loop turn"):
        check_interleaved(log, (SESSION, 0), LONG)


def _reset(generation: int) -> Reset:
    return Reset(session=SESSION, slot=0, generation=generation, reason=Reason.STEP_TIMEOUT)


async def _reset_mid_prefill(cls) -> tuple[list, int, list]:
    """A STEP on LONG reset after two chunks, then the next generation's STEP: the log,
    the prompt calls when the RESET was read, and the verifier's events."""
    log: list = []
    conn, t, v = await connected(cls(Logged(log)), vocab=VOCAB, slots=1, depth=DEPTH,
                                 support=8, prefixes={0: LONG}, step_timeout=60.0)
    feed_buffered(conn, v.send(step_of(0, DEPTH, top_k=TOP_K, prefix=LONG), now=0.0))
    await until(lambda: len(prompt_calls(log, (SESSION, 0))) >= 2)
    assert conn.drafter.tasks  # still prefilling: the RESET comes mid-prefill
    feed_buffered(conn, v.send(_reset(1)))
    at_reset = len(prompt_calls(log, (SESSION, 0)))
    await until(lambda: not conn.drafter.tasks)
    sent = kinds(t.take())
    assert Reply not in sent and Completion not in sent, sent
    assert len(prompt_calls(log, (SESSION, 0))) == at_reset  # stopped with the chunk in hand
    step = step_of(0, DEPTH, top_k=TOP_K, generation=2, prefix=LONG)
    feed_buffered(conn, v.send(step, now=0.0))
    await until(lambda: not conn.drafter.tasks)
    return log, at_reset, v.receive_data(t.take(), 0.0)


async def test_a_reset_mid_prefill_stops_it_and_the_next_step_resumes_with_extend():
    log, at_reset, events = await _reset_mid_prefill(EngineProposer)
    assert 2 <= at_reset < CHUNKS
    calls = prompt_calls(log, (SESSION, 0))
    assert [what for what, _ in calls] == ["open"] + ["extend"] * (CHUNKS - 1)  # no reopen
    assert sum(n for _, n in calls) == len(LONG)
    [ready] = events
    assert isinstance(ready, ProposalReady) and ready.generation == 2
    step = step_of(0, DEPTH, top_k=TOP_K, generation=2, prefix=LONG)
    assert list(ready.draft_ids) == chain(step, LONG)


async def test_planted_reopen_of_an_interrupted_prefill_is_rejected():
    log, _, events = await _reset_mid_prefill(Reopens)
    assert [e.generation for e in events if isinstance(e, ProposalReady)] == [2]
    opens = [what for what, _ in prompt_calls(log, (SESSION, 0))].count("open")
    assert opens == 2  # the test above asks for one


def _step(prefix, round_id=1):
    return msgspec.structs.replace(step_of(0, DEPTH, top_k=TOP_K, prefix=prefix),
                                   round_id=round_id)


def _one_chunk_in():
    """A proposer over a logged engine, LONG's prepare one chunk in."""
    log: list = []
    engine = Logged(log)
    proposer = EngineProposer(engine)
    step = _step(LONG)
    pieces = proposer.prepare(step, LONG)
    next(pieces)
    return log, engine, proposer, (SESSION, 0), step, pieces


def test_a_prepare_left_part_way_is_resumed_by_rows_and_by_later_prefixes():
    log, engine, proposer, key, step, pieces = _one_chunk_in()
    next(pieces)  # two chunks, then the STEP stops (a RESET)
    pieces.close()
    assert engine._requests.get(key).committed == LONG[:2 * PREFILL_CHUNK]
    # rows() without prepare (a bench's direct call) finishes the prefill itself
    drafted = [t for t, _ in proposer.rows(step, LONG)]
    assert drafted == chain(step, LONG)
    assert [what for what, _ in prompt_calls(log, key)] == ["open"] + ["extend"] * (CHUNKS - 1)
    # drafts held, and a longer prefix that is not their commit: reset and extended
    longer = LONG + [(drafted[0] + 1) % VOCAB] + [i % VOCAB for i in range(PREFILL_CHUNK + 2)]
    step = _step(longer, 2)
    # two chunks, one yield each, of its ids
    assert list(proposer.prepare(step, longer)) == [PREFILL_CHUNK,
                                                    len(longer) - len(LONG) - PREFILL_CHUNK]
    drafted = [t for t, _ in proposer.rows(step, longer)]
    assert drafted == chain(step, longer)
    assert [what for what, _ in prompt_calls(log, key)].count("open") == 1
    # the verifier's commit of one draft and a token: a commit, nothing to yield for
    committed = longer + drafted[:1] + [5]
    step = _step(committed, 3)
    assert list(proposer.prepare(step, committed)) == []
    assert [t for t, _ in proposer.rows(step, committed)] == chain(step, committed)


def test_an_extend_that_fails_starts_the_request_over():
    log, engine, proposer, key, step, pieces = _one_chunk_in()
    engine.failing.add("extend")
    with pytest.raises(RuntimeError, match="planted"):
        next(pieces)
    assert key not in engine._requests.ledgers  # closed: what it held is unknown
    assert [t for t, _ in proposer.rows(step, LONG)] == chain(step, LONG)
    assert [what for what, _ in prompt_calls(log, key)].count("open") == 2


@pytest.mark.parametrize("top_k", [8, None], ids=["sampled", "token-only"])
def test_rows_stopped_early_then_every_yielded_draft_committed_extends(top_k):
    """A RESET after two of three rows: the drafter took the first draft (with the second
    row's forward), not the second. A later prefix that accepts both (target-only steps
    that matched them) is reached by extending; counting the second as held (as before)
    asked the drafter to commit a draft it never took, refused, and the request was
    closed and prefilled again from its first token."""
    drafter = ToyDrafterEngine(ToyDrafter.preset(ToySpec(vocab=64, seed=3), "far"))
    proposer = EngineProposer(drafter)
    prefix = [1, 2, 3, 4, 5]
    step = step_of(0, 3, top_k=top_k, prefix=prefix)
    rows = proposer.rows(step, prefix)
    d1, _ = next(rows)
    d2, _ = next(rows)
    rows.close()  # the StepDrafter returned: the step is no longer live
    opened = []
    real_open = drafter.open
    drafter.open = lambda key, committed: (opened.append(len(committed)),
                                           real_open(key, committed))[1]
    later = prefix + [d1, d2, 7]
    step2 = msgspec.structs.replace(step_of(0, 3, top_k=top_k, generation=2, prefix=later),
                                    round_id=2)
    for _ in proposer.prepare(step2, later):
        pass
    assert drafter._requests.get((SESSION, 0)).committed == later
    assert opened == []  # extended from the first draft, not reopened


def test_a_request_mid_prefill_is_not_evicted_by_other_slots(monkeypatch):
    """The drafter keeps MAX_OPEN_REQUESTS requests, least recently used freed first;
    between two chunks of one slot's prefill the loop runs other slots' STEPs, which
    must not free it (its prefill would start over from its first token)."""
    monkeypatch.setattr(engine_proposer, "MAX_OPEN_REQUESTS", 2)
    log: list = []
    engine = Logged(log)
    proposer = EngineProposer(engine)
    pieces = proposer.prepare(_step(LONG), LONG)
    next(pieces)  # slot 0 one chunk in; slots 1 and 2 prepare meanwhile
    for slot in (1, 2):
        step = step_of(slot, DEPTH, top_k=TOP_K, prefix=[slot, 5, 6])
        assert list(proposer.prepare(step, [slot, 5, 6])) == [3]
    assert sum(pieces) == len(LONG) - PREFILL_CHUNK  # the rest of slot 0's chunks
    assert engine._requests.get((SESSION, 0)).committed == LONG
    assert [what for what, _ in prompt_calls(log, (SESSION, 0))].count("open") == 1
    assert (SESSION, 1) not in engine._requests.ledgers  # the one freed instead
    assert len(proposer._held) == 2  # the bound kept: slot 1 freed in its place


def test_a_bringing_closed_after_the_next_began_keeps_the_key_unevictable(monkeypatch):
    """A stopped STEP's prepare closed only after the next bringing of the same key began
    (a prefill ahead, a later STEP): the key is still mid-prefill and never evicted (a
    set of keys, as before, forgot it at the first close)."""
    monkeypatch.setattr(engine_proposer, "MAX_OPEN_REQUESTS", 1)
    log: list = []
    proposer = EngineProposer(Logged(log))
    key = (SESSION, 0)
    first = proposer.prepare(_step(LONG), LONG)
    next(first)
    second = proposer.prefill(key, LONG)
    next(second)
    first.close()
    step = step_of(1, DEPTH, top_k=TOP_K, prefix=[1, 5, 6])
    assert list(proposer.prepare(step, [1, 5, 6])) == [3]  # another slot, past the bound
    assert len(list(second)) == CHUNKS - 2
    assert [what for what, _ in prompt_calls(log, key)].count("open") == 1  # never evicted
