"""EngineDecider prefills a prompt in chunks (``Target.open`` then ``Target.extend``):
the target ends up holding the whole prompt, another request's round runs between two
chunks instead of after the whole prompt (its commit too), and a request cancelled
mid-prefill (its client left) stops after the chunk in hand.

The target here is the toy's engine with every prompt call held at a gate the test
opens one call at a time, so the order of the engine's calls is the test's, not the
scheduler's. The planted variant is a decider that hands the whole prompt over in one
call (what EngineDecider did before): both ordering tests reject it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import LocalProtocolError
from pp1q.models.toy import ToySpec, ToyTarget
from pp1q.models.toy_engine import ToyTargetEngine
from pp1q.verifier.api import GenerateRequest
from pp1q.verifier.engine_decider import EngineDecider
from pp1q.verifier.job import Job

VOCAB = 64
CHUNK = 4
LONG = [int(i % VOCAB) for i in range(7, 7 + 10 * CHUNK)]  # ten chunks
SHORT = [3, 1, 4]
PROMPT_CALLS = ("open", "extend")
WAIT_S = 10.0  # a bound on every wait, so a regression fails instead of hanging


class GatedTarget(ToyTargetEngine):
    """The toy's engine whose ``open`` / ``extend`` of a prompt longer than SHORT wait,
    in the engine's thread, until the test lets one through; every call is logged."""

    def __init__(self) -> None:
        super().__init__(ToyTarget(ToySpec(vocab=VOCAB)))
        self.calls: list[tuple[str, object, int]] = []
        self.gate = threading.Semaphore(0)
        self.arrived = threading.Semaphore(0)

    def _held(self, name: str, request, prompt) -> None:
        if len(prompt) > len(SHORT) or name == "extend":
            self.arrived.release()
            assert self.gate.acquire(timeout=WAIT_S), "the test never let the call through"
        self.calls.append((name, request, len(prompt)))

    def open(self, request, prompt) -> None:
        self._held("open", request, prompt)
        super().open(request, prompt)

    def extend(self, request, prompt) -> None:
        self._held("extend", request, prompt)
        super().extend(request, prompt)

    def score(self, batch):
        self.calls.append(("score", tuple(r for r, _ in batch), 0))
        return super().score(batch)

    def commit(self, request, accepted: int, token: int) -> None:
        self.calls.append(("commit", request, 0))
        super().commit(request, accepted, token)

    def prefilled(self, request) -> int:
        return sum(n for name, r, n in self.calls if r == request and name in PROMPT_CALLS)


class WholePromptDecider(EngineDecider):
    """Planted: the whole prompt in one engine call, as before the chunking."""

    async def open(self, job: Job) -> None:
        await self._call(self.target.open, job.slot, list(job.prefix.tokens))


class NoWaitDecider(EngineDecider):
    """Planted: chunks without waiting for the rounds in hand to commit."""

    async def open(self, job: Job) -> None:
        prompt, n = list(job.prefix.tokens), self.prefill_chunk
        await self._call(self.target.open, job.slot, prompt[:n])
        for i in range(n, len(prompt), n):
            await self._call(self.target.extend, job.slot, prompt[i:i + n])


def _job(prompt: list[int], slot: int) -> Job:
    req = GenerateRequest(prompt=prompt, max_tokens=4, seed=slot + 1, speculative=False,
                          greedy=False, draft_temperature=1.0, top_k=None)
    return Job(req, slot)


def _decider(cls=EngineDecider, chunk: int = CHUNK) -> tuple[EngineDecider, GatedTarget]:
    target = GatedTarget()
    return cls(target, slots=2, depth=3, draws=DrawKeys(bytes(range(32))),
               prefill_chunk=chunk), target


async def _arrived(target: GatedTarget) -> None:
    """Wait until a held prompt call is in the engine's thread."""
    ok = await asyncio.get_running_loop().run_in_executor(
        None, lambda: target.arrived.acquire(timeout=WAIT_S))
    assert ok, "no prompt call reached the engine"


async def test_a_chunked_prefill_holds_the_whole_prompt():
    decider, target = _decider()
    job = _job(LONG, 0)
    opening = asyncio.ensure_future(decider.open(job))
    for _ in range(len(LONG) // CHUNK):
        await _arrived(target)
        target.gate.release()
    await asyncio.wait_for(opening, WAIT_S)
    assert [c[0] for c in target.calls] == ["open"] + ["extend"] * (len(LONG) // CHUNK - 1)
    assert target._requests.get(0).committed == LONG
    # the toy's rows do not depend on the chunks, so the step below checks the engine
    # holds the same prompt either way; the real model's rows after chunks are held to
    # the whole prompt's in tests/models/test_hf_target.py (1e-4)
    chunked = await decider.decide_target_only(job, 0, 0)

    whole, plain = _decider(chunk=len(LONG))  # one call: the prompt fits one chunk
    opening = asyncio.ensure_future(whole.open(_job(LONG, 0)))
    await _arrived(plain)
    plain.gate.release()
    await asyncio.wait_for(opening, WAIT_S)
    assert [c[0] for c in plain.calls] == ["open"]
    assert await whole.decide_target_only(_job(LONG, 0), 0, 0) == chunked


@pytest.mark.parametrize("cls", [EngineDecider, WholePromptDecider, NoWaitDecider],
                         ids=["chunked", "planted-whole-prompt", "planted-no-wait"])
async def test_another_requests_round_runs_between_two_chunks(cls):
    decider, target = _decider(cls)
    short = _job(SHORT, 1)
    await decider.open(short)  # short prompts pass the gate
    opening = asyncio.ensure_future(decider.open(_job(LONG, 0)))
    await _arrived(target)  # the long prompt's first call is in the engine's thread
    scoring = asyncio.ensure_future(decider.decide_target_only(short, 0, 0))
    for _ in range(100):  # until the round's forward is queued behind the call in hand
        if decider._draining and not decider._queue:
            break
        await asyncio.sleep(0)
    else:
        raise AssertionError("the round's forward was never handed to the engine")
    target.gate.release()  # that call ends; from here on every prompt call passes
    for _ in range(len(LONG) // CHUNK):
        target.gate.release()
    await asyncio.wait_for(asyncio.gather(opening, scoring), WAIT_S)
    order = [name for name, r, _ in target.calls if r != 1 or name in ("score", "commit")]
    scored_at = order.index("score")
    if cls is WholePromptDecider:
        assert order[scored_at:] == ["score", "commit"]  # planted: after the whole prompt
        return
    if cls is NoWaitDecider:  # planted: the commit queued behind the next chunk
        assert order[scored_at:scored_at + 3] == ["score", "extend", "commit"]
        return
    # it ran after the first chunk, its commit too before the next chunk
    assert order[scored_at:] == ["score", "commit"] + ["extend"] * (len(LONG) // CHUNK - 1)


@pytest.mark.parametrize("cls", [EngineDecider, WholePromptDecider],
                         ids=["chunked", "planted-whole-prompt"])
async def test_a_request_cancelled_mid_prefill_stops_after_the_chunk_in_hand(cls):
    decider, target = _decider(cls)
    job = _job(LONG, 0)
    opening = asyncio.ensure_future(decider.open(job))
    await _arrived(target)  # the first call is in hand when the client leaves
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    decider.close(job)  # what the scheduler does as the request unwinds
    for _ in range(len(LONG) // CHUNK):
        target.gate.release()
    await decider._call(lambda: None)  # every call queued before this one has run
    prefilled = target.prefilled(0)
    if cls is WholePromptDecider:
        assert prefilled == len(LONG)  # planted: the whole prompt, for a client long gone
        return
    assert prefilled == CHUNK
    assert 0 not in target._requests.ledgers  # closed after the chunk in hand


def test_the_toy_engine_refuses_to_extend_a_request_holding_drafts():
    target = ToyTargetEngine(ToyTarget(ToySpec(vocab=VOCAB)))
    target.open("r", SHORT)
    target.extend("r", [5, 6])
    target.score([("r", [1, 2])])
    with pytest.raises(LocalProtocolError, match="speculative"):
        target.extend("r", [7])
    target.commit("r", 1, 9)
    assert target._requests.get("r").committed == SHORT + [5, 6, 1, 9]
