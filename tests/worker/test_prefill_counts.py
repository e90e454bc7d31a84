"""A verifier peer that sends whole CONTEXTs and never a STEP still makes the worker's
drafter prefill (the prompt ahead, pp1q.worker.drafting): a bounded cost, and counted.
Against the worker daemon over loopback TCP a scripted verifier gives slot 0 a long
prompt and replaces it mid-prefill with a short one, RESETs slot 1 mid-prefill and
leaves with slot 2 mid-prefill, with no STEP: ``pp1q_draft_prefills_total`` shows one
prefill ended each way (superseded, completed, reset, closed) and
``pp1q_draft_prefill_tokens_total`` the ids the drafter's own calls took. The drafter is
the toy's engine behind EngineProposer, each prompt call slow and logged (tests/support/
draft_prefill.py), given to the daemon through its ``proposer`` seam. Planted through
the same seam: a proposer whose prefill pieces report no ids."""

from __future__ import annotations

import asyncio

import pytest
from draft_prefill import VOCAB, Slow, Unreported, prefills_ended, prompt_calls, prompt_ids
from worker_harness import SESSION, TIMEOUT_S, session, set_context, worker_daemon

from pp1q.core.errors import Reason
from pp1q.core.prefix import Prefix
from pp1q.models.engine import PREFILL_CHUNK
from pp1q.runtime.settings import WorkerSettings
from pp1q.tools.chaos.rig import scrape, value
from pp1q.wire import Reset
from pp1q.worker.engine_proposer import EngineProposer

pytestmark = pytest.mark.daemons  # serves a worker daemon on loopback

# 16 chunks of CALL_S each (~64 ms): a frame sent once its first chunk ran is read while
# it still runs (the worker reads between two chunks)
LONG = [(7 * i + 3) % VOCAB for i in range(16 * PREFILL_CHUNK)]
SHORT = LONG[:50]  # one chunk
ENDED = {"superseded": 1, "completed": 1, "reset": 1, "closed": 1}


async def _prefilling(log: list, slot: int) -> None:
    """Until the drafter ran a chunk of ``slot``'s prompt."""
    async with asyncio.timeout(TIMEOUT_S):
        while not prompt_calls(log, (SESSION, slot)):
            await asyncio.sleep(0.001)


async def _contexts_alone(cls) -> tuple[dict[str, float], float, int, float]:
    """The scripted peer's CONTEXTs, no STEP: (the prefills ended, by outcome; prefill
    tokens counted; ids the drafter's calls took; STEPs counted)."""
    log: list = []
    settings = WorkerSettings(listen="127.0.0.1:0", vocab=VOCAB, speculation="sampled",
                              metrics_port=0)
    async with worker_daemon(settings, proposer=lambda _toy: cls(Slow(log))) as (port, mport):
        v = await session(port, vocab=VOCAB)
        set_context(v, 0, 1, Prefix(LONG))
        await _prefilling(log, 0)
        set_context(v, 0, 1, Prefix(SHORT))  # a whole CONTEXT again: supersedes slot 0's
        set_context(v, 1, 1, Prefix(LONG))
        await _prefilling(log, 1)
        v.send(Reset(session=SESSION, slot=1, generation=1, reason=Reason.STEP_TIMEOUT))
        set_context(v, 2, 1, Prefix(LONG))
        await _prefilling(log, 2)
        v.writer.close()  # the connection ends mid-prefill
        async with asyncio.timeout(TIMEOUT_S):
            while sum(prefills_ended(lambda n, **l: value(scrape(mport), n, **l)).values()) < 4:
                await asyncio.sleep(0.01)
        samples = scrape(mport)
    return (prefills_ended(lambda n, **l: value(samples, n, **l)),
            value(samples, "pp1q_draft_prefill_tokens_total"), prompt_ids(log),
            value(samples, "pp1q_steps_total"))


def _check(ended: dict[str, float], tokens: float, ids: int, steps: float) -> None:
    assert steps == 0
    assert ended == ENDED
    assert ids > len(SHORT) and tokens == ids  # every chunk the drafter ran, counted once


async def test_contexts_without_a_step_are_counted_by_how_their_prefills_ended():
    _check(*await _contexts_alone(EngineProposer))


async def test_a_planted_proposer_that_does_not_report_its_ids_is_caught():
    ended, tokens, ids, steps = await _contexts_alone(Unreported)
    assert ended == ENDED  # the worker still sees how each ended
    with pytest.raises(AssertionError):
        _check(ended, tokens, ids, steps)
