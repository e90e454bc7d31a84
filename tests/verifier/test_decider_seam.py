"""The scheduler's one decision seam: a trivial fake Decider drives a whole request,
domain errors reach HTTP only through pp1q.verifier.http.STATUS_OF, and no production
module keeps an override or test hook."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from fake_decider import ALONE, BONUS, FakeDecider
from fake_link import FakeLink

from pp1q.core.errors import Pp1qError, Reason, ServiceError
from pp1q.core.outcomes import FallbackCause
from pp1q.runtime.metrics import Metrics
from pp1q.verifier import slot_pool
from pp1q.verifier.api import GenerateRequest
from pp1q.verifier.http import STATUS_OF, as_http
from pp1q.verifier.link import Fallback
from pp1q.verifier.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [3, 1, 4]


def _req(speculative=True, max_tokens=6, greedy=True) -> GenerateRequest:
    return GenerateRequest(prompt=list(PROMPT), max_tokens=max_tokens, seed=5,
                           speculative=speculative, greedy=greedy, draft_temperature=1.0,
                           top_k=None)


def _scheduler(decider, link=None, slots=1) -> Scheduler:
    return Scheduler(link or FakeLink(), decider, Metrics("verifier"), slots=slots, depth=2)


async def test_speculative_request_through_a_fake_decider():
    decider, link = FakeDecider(), FakeLink()
    answer = await _scheduler(decider, link).generate(_req())
    assert answer["token_ids"] == [5, 9, BONUS, 5, 9, BONUS]
    assert [c[0] for c in decider.calls] == ["open", "round", "round", "close"]
    assert [(c.accepted, c.token, c.round_id) for c in link.commits] == [(2, BONUS, 1),
                                                                         (2, BONUS, 2)]
    assert answer["stats"]["rounds"] == 2 and answer["stats"]["accepted"] == 4
    assert link.resets == [(0, 1, Reason.CANCELLED)]  # the worker's state dropped at release


async def test_the_worker_keeps_the_prefix_over_a_fallback_and_gets_it_all_on_a_mismatch():
    timeout = Fallback(FallbackCause.WATCHDOG_TIMEOUT, Reason.STEP_TIMEOUT)
    mismatch = Fallback(FallbackCause.WORKER_REFUSED, Reason.CHECKSUM_MISMATCH)
    decider, link = FakeDecider(), FakeLink(outcomes=[None, timeout, None, mismatch, None])
    answer = await _scheduler(decider, link).generate(_req(max_tokens=11))
    tokens = list(PROMPT) + answer["token_ids"]
    # round 1: the prompt; COMMIT extends the worker's copy; the timeout's token alone
    # (the worker kept the rest); the digest mismatch: everything, from position 0
    after_timeout = len(PROMPT) + 3
    after_mismatch = after_timeout + 1 + 3 + 1
    assert link.contexts == [(0, list(PROMPT)),
                             (after_timeout, [ALONE]),
                             (0, tokens[:after_mismatch])]


async def test_target_only_and_fallback_steps_go_to_the_decider():
    decider = FakeDecider()
    answer = await _scheduler(decider).generate(_req(speculative=False, max_tokens=2))
    assert answer["token_ids"] == [ALONE, ALONE]
    assert decider.calls[1:3] == [("target_only", 0, 1), ("target_only", 0, 2)]

    decider, link = FakeDecider(), FakeLink(ready=False)
    s = _scheduler(decider, link)
    answer = await s.generate(_req(max_tokens=2))
    assert answer["token_ids"] == [ALONE, ALONE]
    assert answer["stats"]["fallbacks"][FallbackCause.WORKER_UNAVAILABLE.value] == 2
    # no context was ever set: no RESET, nothing to invalidate, old generations keyed
    assert [c for c in decider.calls if c[0] == "target_only"] == [("target_only", 1, 1),
                                                                   ("target_only", 2, 2)]
    assert not link.resets and not any(c[0] == "invalidate" for c in decider.calls)
    assert s.metrics.value("pp1q_rounds_total", kind="fallback") == 2


async def test_a_deciders_service_error_fails_the_request_and_frees_the_slot():
    decider = FakeDecider(fail_open=Reason.RANKS_LOST)
    s = _scheduler(decider)
    with pytest.raises(ServiceError) as e:
        await s.generate(_req())
    assert e.value.reason is Reason.RANKS_LOST
    assert decider.calls == [("open", 0), ("close", 0)]
    assert s.metrics.value("pp1q_requests_total", outcome="error") == 1
    decider.fail_open = None
    assert len((await s.generate(_req(max_tokens=1)))["token_ids"]) == 1  # slot 0 free


async def test_a_full_queue_is_a_service_error(monkeypatch):
    monkeypatch.setattr(slot_pool, "MAX_QUEUED_REQUESTS", 1)
    pool = _scheduler(FakeDecider()).pool
    assert await pool.acquire() == 0  # the only slot
    waiter = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0)
    with pytest.raises(ServiceError) as e:
        await pool.acquire()
    assert e.value.reason is Reason.QUEUE_FULL
    pool.release(0)
    assert await waiter == 0


async def test_requests_answered_503_are_counted_by_reason(monkeypatch):
    monkeypatch.setattr(slot_pool, "MAX_QUEUED_REQUESTS", 0)
    s = _scheduler(FakeDecider())
    held = await s.pool.acquire()  # the only slot, and no room to wait
    with pytest.raises(ServiceError) as e:
        await s.generate(_req())
    assert e.value.reason is Reason.QUEUE_FULL
    assert s.metrics.value("pp1q_requests_refused_total", reason="queue_full") == 1
    s.pool.release(held)
    drained = await s.drain(1.0)  # stopping: every new request refused, counted
    assert (drained.finished, drained.cut, drained.queued) == (0, 0, 0)
    with pytest.raises(ServiceError) as e:
        await s.generate(_req())
    assert e.value.reason is Reason.STOPPING
    assert s.metrics.value("pp1q_requests_refused_total", reason="stopping") == 1
    assert s.metrics.value("pp1q_requests_total", outcome="error") == 0  # never started


def test_reasons_map_to_todays_statuses_in_one_table():
    assert STATUS_OF == {Reason.QUEUE_FULL: (503, "busy"),
                         Reason.TOO_MANY_QUEUED_FROM_ADDRESS: (503, "busy"),
                         Reason.STOPPING: (503, "stopping"),
                         Reason.RANKS_LOST: (503, "ranks_lost"),
                         Reason.RANK_DISAGREEMENT: (500, "rank_disagreement"),
                         Reason.GENERATIONS_EXHAUSTED: (500, "generations_exhausted")}
    h = as_http(ServiceError(Reason.QUEUE_FULL, "256 requests already queued"))
    assert (h.status, h.code, h.message) == (503, "busy", "256 requests already queued")
    assert isinstance(h, Pp1qError) and h.reason is Reason.BAD_REQUEST


HOOKS = re.compile(r"\b(decide_sampled|scheduler_cls|state_cls|drafter_cls|_decide_round|"
                   r"_decide_target_only|_job_started|_invalidated)\b"
                   r"|a planted-bug test overrides|drafting\.propose\s*=")


def test_no_override_or_test_hooks_in_production_code():
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "pp1q").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if HOOKS.search(line)]
    assert not found, found


async def test_a_request_whose_client_leaves_while_queued_is_counted():
    # issue 16's last counting gap: a request cancelled before it took a slot was counted
    # nowhere (requests_total counted only requests that held a slot)
    s = _scheduler(FakeDecider())
    held = await s.pool.acquire()  # the only slot: the next request waits
    waiting = asyncio.ensure_future(s.generate(_req()))
    await asyncio.sleep(0)
    assert s.metrics.value("pp1q_requests_queued") == 1
    waiting.cancel()  # the HTTP client went away (aiohttp cancels its handler)
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert s.metrics.value("pp1q_requests_total", outcome="left_queued") == 1
    assert s.metrics.value("pp1q_requests_total", outcome="error") == 0
    assert s.metrics.value("pp1q_requests_queued") == 0
    s.pool.release(held)
    assert len((await s.generate(_req(max_tokens=1)))["token_ids"]) == 1  # slot 0 free
