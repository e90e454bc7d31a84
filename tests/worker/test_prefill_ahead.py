"""A whole context (a CONTEXT from position 0) starts the drafter's prefill at once,
ahead of the slot's first STEP (``Proposer.prefill``, run by StepDrafter a piece at a
time with the loop turning between two): the verifier sends a request's prompt before
its own target prefills it, so the two prefills run side by side. The STEP takes over
where the prefill got to (``prepare`` goes on from the last chunk done, never reopens),
a RESET stops it after the chunk in hand, and a prefill that fails leaves the STEP to
start over. Each prefill is counted by how it ended (``pp1q_draft_prefills_total``), and
every chunk's ids, ahead or in the STEP's prepare, once (``pp1q_draft_prefill_tokens_total``:
the daemon's CONTEXT-only peer is tests/worker/test_prefill_counts.py).

The drafter is the toy's engine with its prompt calls logged (tests/support/
draft_prefill.py). Planted: a proposer that prefills nothing ahead (as before), one
that prefills ahead in one loop callback (every other slot and read waiting), and one
whose prefill does not report its ids: each is rejected."""

from __future__ import annotations

import asyncio
import logging

import pytest
from draft_prefill import (
    CHUNKS,
    DEPTH,
    LONG,
    TOP_K,
    VOCAB,
    Logged,
    Unreported,
    chain,
    check_interleaved,
    prefills_ended,
    prompt_calls,
    prompt_ids,
    ticker,
)
from wire_helpers import feed_buffered
from worker_round import SESSION, connected, step_of, until

from pp1q.core.errors import Reason
from pp1q.core.prefix import Prefix
from pp1q.wire import Reset
from pp1q.wire.events import ProposalReady
from pp1q.wire.messages import context_of
from pp1q.worker.drafting import Proposer
from pp1q.worker.engine_proposer import EngineProposer

KEY = (SESSION, 0)


class NothingAhead(EngineProposer):
    """Planted: no prefill on a whole context (the STEP's prepare does it all)."""

    prefill = Proposer.prefill


class WholeAhead(EngineProposer):
    """Planted: the prefill ahead in one loop callback (its chunks without a yield)."""

    def prefill(self, key, prefix):
        for _ in super().prefill(key, prefix):
            pass
        return iter(())


async def _connected(cls):
    """Slot 0 given LONG, the ticker running: (log, connection, transport, verifier,
    ticker task)."""
    log: list = []
    conn, t, v = await connected(cls(Logged(log)), vocab=VOCAB, slots=1, depth=DEPTH,
                                 support=8, prefixes={0: LONG}, step_timeout=60.0)
    return log, conn, t, v, asyncio.get_running_loop().create_task(ticker(log))


async def _step(conn, t, v, generation: int = 1) -> list:
    """Slot 0's STEP on LONG, drafted to its end: the verifier's events."""
    feed_buffered(conn, v.send(step_of(0, DEPTH, top_k=TOP_K, generation=generation,
                                       prefix=LONG), now=0.0))
    await until(lambda: not conn.drafter.tasks)
    return v.receive_data(t.take(), 0.0)


def _check_drafted(events: list, generation: int = 1) -> None:
    [ready] = events
    assert isinstance(ready, ProposalReady) and ready.generation == generation
    step = step_of(0, DEPTH, top_k=TOP_K, generation=generation, prefix=LONG)
    assert list(ready.draft_ids) == chain(step, LONG)


def _check_counted(conn, log: list, **ended: float) -> None:
    """The prefills ahead ended as ``ended`` says, and every prompt id the drafter's
    calls took was counted once."""
    assert prefills_ended(conn.metrics.value) == ended
    assert conn.metrics.value("pp1q_draft_prefill_tokens_total") == prompt_ids(log)


async def _prefilled_ahead(cls) -> tuple[list, list, int, object]:
    """The context alone until the loop has turned enough for the whole prefill, then
    the STEP: the log, the verifier's events, the prompt calls made before the STEP and
    the connection."""
    log, conn, t, v, ticking = await _connected(cls)
    try:
        await until(lambda: not conn.drafter.prefills)
        assert t.take() == b""  # a prefill sends nothing
        before = len(prompt_calls(log, KEY))
        events = await _step(conn, t, v)
    finally:
        ticking.cancel()
    return log, events, before, conn


async def test_a_whole_context_is_prefilled_before_its_step_arrives():
    log, events, before, conn = await _prefilled_ahead(EngineProposer)
    assert before == CHUNKS  # every chunk before the STEP, the loop turning between
    check_interleaved(log, KEY, LONG)
    assert len(prompt_calls(log, KEY)) == CHUNKS  # the STEP prefilled nothing again
    _check_drafted(events)
    _check_counted(conn, log, completed=1)


async def test_a_planted_prefill_that_does_not_report_its_ids_is_rejected():
    log, events, before, conn = await _prefilled_ahead(Unreported)
    _check_drafted(events)
    with pytest.raises(AssertionError):
        _check_counted(conn, log, completed=1)


@pytest.mark.parametrize("cls", [NothingAhead, WholeAhead],
                         ids=["planted-nothing-ahead", "planted-whole-ahead"])
async def test_planted_prefills_ahead_are_rejected(cls):
    log, events, before, _ = await _prefilled_ahead(cls)
    _check_drafted(events)  # exact either way: only the timing differs
    with pytest.raises(AssertionError):
        assert before == CHUNKS
        check_interleaved(log, KEY, LONG)


async def test_a_step_mid_prefill_takes_over_where_it_got_to():
    log, conn, t, v, ticking = await _connected(EngineProposer)
    try:
        await until(lambda: len(prompt_calls(log, KEY)) >= 2)
        at_step = len(prompt_calls(log, KEY))
        assert 2 <= at_step < CHUNKS and conn.drafter.prefills
        feed_buffered(conn, v.send(step_of(0, DEPTH, top_k=TOP_K, prefix=LONG), now=0.0))
        assert not conn.drafter.prefills  # stopped at once, between two chunks
        await until(lambda: not conn.drafter.tasks)
        events = v.receive_data(t.take(), 0.0)
    finally:
        ticking.cancel()
    check_interleaved(log, KEY, LONG)  # one open, then extends: nothing done twice
    assert len(prompt_calls(log, KEY)) == CHUNKS
    _check_drafted(events)
    _check_counted(conn, log, taken_over=1)  # the STEP's prepare's chunks counted too


async def test_a_reset_stops_a_prefill_and_the_next_step_resumes_it():
    log, conn, t, v, ticking = await _connected(EngineProposer)
    try:
        await until(lambda: len(prompt_calls(log, KEY)) >= 2)
        feed_buffered(conn, v.send(Reset(session=SESSION, slot=0, generation=1,
                                         reason=Reason.STEP_TIMEOUT)))
        at_reset = len(prompt_calls(log, KEY))
        assert not conn.drafter.prefills
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(prompt_calls(log, KEY)) == at_reset < CHUNKS  # no chunk after it
        events = await _step(conn, t, v, generation=2)  # the prefix was kept over the RESET
    finally:
        ticking.cancel()
    check_interleaved(log, KEY, LONG)
    _check_drafted(events, generation=2)
    _check_counted(conn, log, reset=1)


@pytest.mark.parametrize("call, before", [("open", []), ("extend", ["open"])],
                         ids=["first-chunk", "second-chunk"])
async def test_a_prefill_that_fails_leaves_the_step_to_start_over(caplog, call, before):
    log, conn, t, v, ticking = await _connected(EngineProposer)
    engine = conn.proposer.drafter
    engine.failing.add(call)  # the first open or extend raises: a chunk ran before, or none
    try:
        with caplog.at_level(logging.WARNING, logger="pp1q.worker"):
            await until(lambda: not conn.drafter.prefills)
            events = await _step(conn, t, v)
    finally:
        ticking.cancel()
    assert any("prefilling slot 0 failed: planted" in r.getMessage() for r in caplog.records)
    calls = [what for what, _ in prompt_calls(log, KEY)]
    assert calls == before + ["open"] + ["extend"] * (CHUNKS - 1)  # started over
    _check_drafted(events)
    _check_counted(conn, log, failed=1)  # the failed call took no id: neither logged


def _context(tokens: list[int], generation: int = 1):
    return context_of(session=SESSION, slot=0, generation=generation, tokens=tokens,
                      digest=Prefix(tokens).digest)


async def test_a_context_and_its_step_in_one_read_prefill_nothing_twice():
    log, conn, t, v, ticking = await _connected(EngineProposer)
    try:
        feed_buffered(conn, v.send(_context(LONG)) + v.send(
            step_of(0, DEPTH, top_k=TOP_K, prefix=LONG), now=0.0))
        assert not conn.drafter.prefills  # the STEP stopped the prefill before it ran
        await until(lambda: not conn.drafter.tasks)
        events = v.receive_data(t.take(), 0.0)
    finally:
        ticking.cancel()
    _check_drafted(events)
    assert not conn.proposer._busy
    assert len(prompt_calls(log, KEY)) == CHUNKS
    _check_counted(conn, log)  # the prefill never ran: no work, none counted


async def test_a_reset_and_a_new_context_mid_prepare_keep_the_new_prefill_unevictable():
    """A STEP mid-prepare, then a RESET and a whole new context in one read: the new
    prefill holds its key unevictable for as long as it runs."""
    other = [(5 * i + 1) % VOCAB for i in range(len(LONG))]
    log, conn, t, v, ticking = await _connected(EngineProposer)
    try:
        feed_buffered(conn, v.send(step_of(0, DEPTH, top_k=TOP_K, prefix=LONG), now=0.0))
        await until(lambda: len(prompt_calls(log, KEY)) >= 2)
        feed_buffered(conn, v.send(Reset(session=SESSION, slot=0, generation=1,
                                         reason=Reason.STEP_TIMEOUT))
                      + v.send(_context(other, generation=2)))
        seen = []
        for _ in range(30):
            await asyncio.sleep(0)
            if conn.drafter.prefills and not conn.drafter.prefills[0].task.done():
                seen.append(KEY in conn.proposer._busy)
        assert seen and all(seen), seen
        await until(lambda: not conn.drafter.prefills)
    finally:
        ticking.cancel()
    assert not conn.proposer._busy


async def test_a_step_read_during_the_last_chunk_counts_a_completed_prefill():
    """The STEP read while the prefill's last chunk runs (queued on the loop before the
    prefill's pause ends, as a read during a real model's chunk is): every chunk ran
    ahead, so the prefill completed; the STEP's prepare has nothing left to do."""
    log, conn, t, v, ticking = await _connected(EngineProposer)
    engine = conn.proposer.drafter
    extend = engine.extend
    loop = asyncio.get_running_loop()

    def last_then_step(request, committed):
        extend(request, committed)
        if prompt_ids(log) == len(LONG):  # the last chunk: the STEP's bytes arrive now
            loop.call_soon(feed_buffered, conn, v.send(
                step_of(0, DEPTH, top_k=TOP_K, prefix=LONG), now=0.0))

    engine.extend = last_then_step
    try:
        await until(lambda: prompt_ids(log) == len(LONG) and not conn.drafter.prefills
                    and not conn.drafter.tasks)
        events = v.receive_data(t.take(), 0.0)
    finally:
        ticking.cancel()
    assert len(prompt_calls(log, KEY)) == CHUNKS  # every chunk ran ahead, none again
    _check_drafted(events)
    _check_counted(conn, log, completed=1)
