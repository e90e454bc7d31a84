"""A speculative request's prompt goes to the worker (CONTEXT) before the target prefills
it, so the worker's drafter prefills beside the target instead of after it; the first
round then sends its STEP alone, under the same generation. Nothing goes ahead for a
request whose first round would not speculate (target-only, the circuit open, a prompt
past what the worker holds, no worker), and a request cancelled while the target
prefills RESETs the worker (reason cancelled).

The scheduler runs against an in-process link (tests/support/fake_link.py) and a decider
whose ``open`` (the target's prefill) records what the worker had been sent by then.
Planted: a scheduler that sends nothing ahead (the context with the first STEP, as
before) is rejected."""

from __future__ import annotations

import asyncio

import pytest
from fake_decider import FakeDecider
from fake_link import FakeLink

from pp1q.core.errors import Reason
from pp1q.runtime.metrics import Metrics
from pp1q.verifier.api import GenerateRequest
from pp1q.verifier.scheduler import Scheduler

PROMPT = [3, 1, 4, 1, 5]
DEPTH = 2


class Prefilling(FakeDecider):
    """Records, when the target's prefill (``open``) begins, the CONTEXTs the link sent."""

    def __init__(self, link: FakeLink, hold: asyncio.Event | None = None) -> None:
        super().__init__()
        self.link, self.hold = link, hold
        self.sent_at_open: list | None = None

    async def open(self, job):
        self.sent_at_open = list(self.link.contexts)
        await super().open(job)
        if self.hold is not None:  # a long prefill: until the test lets it end
            await self.hold.wait()


def _req(speculative: bool = True, prompt=PROMPT) -> GenerateRequest:
    return GenerateRequest(prompt=list(prompt), max_tokens=6, seed=5, speculative=speculative,
                           greedy=True, draft_temperature=1.0, top_k=None)


async def _run(link: FakeLink, req: GenerateRequest | None = None) -> Prefilling:
    decider = Prefilling(link)
    await Scheduler(link, decider, Metrics("verifier"), slots=1, depth=DEPTH).generate(
        req or _req())
    return decider


def _check_ahead(decider: Prefilling, link: FakeLink) -> None:
    assert decider.sent_at_open == [(0, PROMPT)]  # the whole prompt, before the prefill
    assert link.contexts == [(0, PROMPT)]  # ... and never again: the rounds' STEPs alone
    assert link.steps and link.steps[0].generation == link.context_generations[0]


async def test_the_prompt_reaches_the_worker_before_the_target_prefills_it():
    link = FakeLink()
    _check_ahead(await _run(link), link)


async def test_planted_context_with_the_first_step_is_rejected(monkeypatch):
    monkeypatch.setattr(Scheduler, "_context_ahead", lambda self, job: None)
    link = FakeLink()
    decider = await _run(link)
    assert link.contexts == [(0, PROMPT)]  # sent, with the first STEP: served as before
    with pytest.raises(AssertionError):
        _check_ahead(decider, link)


def _target_only(link: FakeLink) -> GenerateRequest:
    return _req(speculative=False)


def _circuit_open(link: FakeLink) -> GenerateRequest:
    link.circuit = True
    return _req()


def _past_the_worker(link: FakeLink) -> GenerateRequest:
    link.max_context = len(PROMPT) + DEPTH  # one short of a round's
    return _req()


def _no_worker(link: FakeLink) -> GenerateRequest:
    link.ready = False
    return _req()


@pytest.mark.parametrize("case", [_target_only, _circuit_open, _past_the_worker, _no_worker],
                         ids=lambda f: f.__name__.strip("_"))
async def test_nothing_goes_ahead_when_the_first_round_would_not_speculate(case):
    link = FakeLink()
    decider = await _run(link, case(link))
    assert decider.sent_at_open == []
    assert link.contexts == [] and link.steps == []


async def test_a_request_cancelled_while_the_target_prefills_resets_the_worker():
    link = FakeLink()
    decider = Prefilling(link, hold=asyncio.Event())
    scheduler = Scheduler(link, decider, Metrics("verifier"), slots=1, depth=DEPTH)
    task = asyncio.get_running_loop().create_task(scheduler.generate(_req()))
    for _ in range(20):
        await asyncio.sleep(0)
    assert decider.sent_at_open == [(0, PROMPT)] and not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert link.resets == [(0, link.context_generations[0], Reason.CANCELLED)]
    assert link.steps == []


async def test_a_fallback_before_the_first_step_sends_only_its_token():
    """The circuit opens while the target prefills: the first round falls back without a
    STEP (no RESET: nothing was proposed), and the next round's CONTEXT carries only the
    fallback's token, under the new generation."""
    link = FakeLink()

    class TripsDuringPrefill(Prefilling):
        async def open(self, job):
            await super().open(job)
            link.circuit = True  # tripped by other requests' timeouts meanwhile

        async def decide_target_only(self, job, generation, round_id):
            link.circuit = False  # closed again for the next round
            return await super().decide_target_only(job, generation, round_id)

    decider = TripsDuringPrefill(link)
    answer = await Scheduler(link, decider, Metrics("verifier"), slots=1,
                             depth=DEPTH).generate(_req())
    assert answer["stats"]["fallbacks"]["circuit_open"] == 1
    tokens = PROMPT + answer["token_ids"]
    assert link.contexts == [(0, PROMPT), (len(PROMPT), tokens[len(PROMPT):len(PROMPT) + 1])]
    assert link.context_generations == [1, 2] and link.steps[0].generation == 2
    assert link.resets == [(0, 2, Reason.CANCELLED)]  # only the release's
