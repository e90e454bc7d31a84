"""The worker's bound on a real drafter's memory (pp1q.worker.engine_proposer): past
``draft_kv_budget_bytes`` the least recently used request not being prefilled is dropped
and counted, and its next STEP prefills it again to the same rows; a request whose growth
would pass the budget while every other one is mid-prefill is dropped itself and its STEP
refused (``draft_kv_budget``); a session's requests are freed when it ends, also one
whose prefill a cancelled STEP was running. Through the seams production uses: a toy
engine that reports 1000 bytes a committed token, the worker daemon's ``proposer``."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from draft_prefill import model
from worker_harness import SESSION, TIMEOUT_S, session, set_context, worker_daemon

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.prefix import Prefix
from pp1q.models.engine import PREFILL_CHUNK
from pp1q.models.toy_engine import ToyDrafterEngine
from pp1q.runtime.settings import WorkerSettings
from pp1q.wire import Step
from pp1q.worker.drafting import Proposer
from pp1q.worker.engine_proposer import EngineProposer

TOKEN_BYTES = 1000


class Sized(ToyDrafterEngine):
    """The toy's engine, holding TOKEN_BYTES of "K/V" per token it was given (committed
    and drafted)."""

    def __init__(self) -> None:
        super().__init__(model())
        self.opened: list = []

    def open(self, request, committed) -> None:
        self.opened.append(request)
        super().open(request, committed)

    def kv_bytes(self, request) -> int:
        ledger = self._requests.ledgers.get(request)
        return 0 if ledger is None else TOKEN_BYTES * len(ledger.tokens)

    def held(self) -> set:
        return set(self._requests.ledgers)


def _step(key, prefix, round_id=1):
    session_id, slot = key
    return Step(session=session_id, slot=slot, generation=1, round_id=round_id,
                last_committed=len(prefix) - 1, first_position=len(prefix), prefix_digest=0,
                depth=3, temperature=0.8, top_k=8, context_version=0, seed=11)


def _rows(proposer, key, prefix, round_id=1):
    return [(t, tuple(r.ids), tuple(r.counts))
            for t, r in proposer.rows(_step(key, prefix, round_id), prefix)]


def _prompt(n: int, salt: int) -> list[int]:
    return [(5 * i + salt) % 64 for i in range(n)]


def _proposer(budget_tokens: int) -> tuple[EngineProposer, Sized, list]:
    dropped: list = []
    proposer = EngineProposer(Sized())
    proposer.limit_memory(budget_tokens * TOKEN_BYTES, lambda: dropped.append(1))
    return proposer, proposer.drafter, dropped


def test_past_the_budget_the_least_recently_used_is_dropped_and_prefilled_again():
    proposer, drafter, dropped = _proposer(budget_tokens=250)
    a, b, c = (1, 0), (1, 1), (1, 2)
    prompts = {k: _prompt(100, i) for i, k in enumerate((a, b, c))}
    first = {k: _rows(proposer, k, p) for k, p in prompts.items()}
    # 300 tokens held at c's prefill: a, the least recently used, went
    assert dropped == [1] and drafter.held() == {b, c}
    assert drafter.opened == [a, b, c]
    # a's next STEP opens it again (b goes now), and its rows are what they were
    assert _rows(proposer, a, prompts[a]) == first[a]
    assert drafter.opened == [a, b, c, a] and drafter.held() == {c, a} and len(dropped) == 2
    fresh, _, _ = _proposer(budget_tokens=1000)  # nothing dropped: the same rows
    assert [_rows(fresh, k, p) for k, p in prompts.items()] == list(first.values())


def test_growth_past_the_budget_with_every_other_request_mid_prefill_is_refused():
    proposer, drafter, dropped = _proposer(budget_tokens=PREFILL_CHUNK * 5)
    a, b = (1, 0), (1, 1)
    long_a, long_b = _prompt(PREFILL_CHUNK * 4, 1), _prompt(PREFILL_CHUNK * 4, 2)
    pieces_a, pieces_b = proposer.prefill(a, long_a), proposer.prefill(b, long_b)
    for _ in range(2):  # two chunks each, in turn
        next(pieces_a)
        next(pieces_b)
    next(pieces_a)  # a: three chunks; five held in all, at the budget
    with pytest.raises(LocalProtocolError) as e:
        next(pieces_b)  # b's third chunk would pass it, and a is mid-prefill
    assert e.value.reason is Reason.DRAFT_KV_BUDGET
    assert drafter.held() == {a} and dropped == []  # b dropped itself, a untouched
    for _ in pieces_a:  # a goes on alone, up to its whole prompt
        pass
    assert drafter.held() == {a}
    assert drafter._requests.ledgers[a].committed == long_a


def test_a_sessions_requests_are_freed_when_it_ends_even_mid_prefill():
    proposer, drafter, _ = _proposer(budget_tokens=10_000)
    done, midway = (1, 0), (1, 1)
    _rows(proposer, done, _prompt(50, 1))
    pieces = proposer.prepare(_step(midway, _prompt(300, 2)), _prompt(300, 2))
    next(pieces)  # a STEP's prepare between two chunks: its task is cancelled, not ended
    proposer.forget(done)
    proposer.forget(midway)
    assert drafter.held() == {midway}  # still being brought: freed when that stops
    pieces.close()  # the cancelled STEP task unwinds
    assert drafter.held() == set()
    assert proposer._total == 0


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT_S) as r:
        return r.read().decode()


class _Recording(Proposer):
    """The toy's Proposer, recording what the daemon bounds it by and what it forgets."""

    made: list = []

    def __init__(self, model_) -> None:
        super().__init__(model_)
        self.limits: list = []
        self.forgotten: list = []
        _Recording.made.append(self)

    def limit_memory(self, kv_budget_bytes, on_dropped) -> None:
        self.limits.append(kv_budget_bytes)
        on_dropped()  # counted in the daemon's metric

    def forget(self, key) -> None:
        self.forgotten.append(key)


async def test_the_daemon_bounds_its_proposer_and_frees_a_closed_sessions_slots():
    settings = WorkerSettings(listen="127.0.0.1:0", vocab=64, draft_preset="far",
                              speculation="sampled", metrics_port=0,
                              draft_kv_budget_bytes=3 << 20)
    async with worker_daemon(settings, proposer=_Recording) as (port, mport):
        recording = _Recording.made[-1]
        assert recording.limits == [3 << 20]
        v = await session(port, vocab=64)
        set_context(v, 0, 1, Prefix([3, 4, 5]))
        v.writer.close()
        async with asyncio.timeout(TIMEOUT_S):
            while not recording.forgotten:
                await asyncio.sleep(0.01)
        assert recording.forgotten == [(SESSION, slot) for slot in range(4)]
        body = await asyncio.to_thread(_scrape, mport)
        assert "pp1q_draft_kv_evictions_total 1.0" in body  # the daemon's on_dropped


def test_a_request_drafting_rows_is_not_dropped_for_another_ones_growth():
    """A STEP awaits between its rows (the peer reads slowly): meanwhile another
    request's prefill passes the budget; the drafting one is in use, so the grower is
    refused and the draft goes on; its session's end frees it once the rows stop."""
    proposer, drafter, dropped = _proposer(budget_tokens=PREFILL_CHUNK * 2)
    a, b = (1, 0), (1, 1)
    prompt_a = _prompt(PREFILL_CHUNK, 1)
    rows = proposer.rows(_step(a, prompt_a), prompt_a)
    next(rows)  # a's first row: a holds one chunk
    pieces = proposer.prefill(b, _prompt(PREFILL_CHUNK * 2, 2))
    next(pieces)  # b: one chunk, at the budget
    with pytest.raises(LocalProtocolError) as e:
        next(pieces)  # b's second chunk: a is drafting, b is refused
    assert e.value.reason is Reason.DRAFT_KV_BUDGET and dropped == []
    assert len(list(rows)) == 2  # a's other rows (depth 3) come from its request
    proposer.forget(a)
    assert drafter.held() == set()
    rows = proposer.rows(_step(a, prompt_a, round_id=2), prompt_a)
    next(rows)
    proposer.forget(a)  # the session ends mid-draft
    assert drafter.held() == {a}
    rows.close()
    assert drafter.held() == set() and proposer._total == 0


def test_one_request_past_the_budget_alone_is_refused_without_dropping_the_others():
    proposer, drafter, dropped = _proposer(budget_tokens=250)
    a, b, c = (1, 0), (1, 1), (1, 2)
    _rows(proposer, a, _prompt(10, 1))
    _rows(proposer, b, _prompt(10, 2))
    with pytest.raises(LocalProtocolError) as e:  # c's second chunk: 256 tokens alone
        _rows(proposer, c, _prompt(2 * PREFILL_CHUNK, 3))
    assert e.value.reason is Reason.DRAFT_KV_BUDGET
    assert drafter.held() == {a, b} and dropped == []  # dropping them would not help


def test_the_drafts_a_step_adds_are_counted():
    proposer, drafter, _ = _proposer(budget_tokens=10_000)
    key, prefix = (1, 0), _prompt(40, 1)
    _rows(proposer, key, prefix)  # depth 3: the drafts' K/V held after the rows
    assert proposer._total == drafter.kv_bytes(key) == TOKEN_BYTES * (40 + 3)
