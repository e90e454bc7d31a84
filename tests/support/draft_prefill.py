"""A toy drafter engine whose prompt calls and rows are logged, for the worker's
chunked-prefill tests (tests/worker/test_chunked_draft_prefill.py, test_prefill_ahead.py,
test_prefill_counts.py): each ``open``, ``extend`` and row goes into one list with the
ticks of a task that turns with the loop, so the log shows what ran between two chunks;
and what the worker counted of its prefills, beside what the drafter's calls took."""

from __future__ import annotations

import asyncio
import contextlib
import time

from pp1q.core.outcomes import PrefillOutcome
from pp1q.models.engine import PREFILL_CHUNK
from pp1q.models.toy import ToyDrafter, ToySpec
from pp1q.models.toy_engine import ToyDrafterEngine
from pp1q.worker.drafting import Proposer
from pp1q.worker.engine_proposer import EngineProposer

VOCAB, DEPTH, TOP_K = 64, 3, 8
CHUNKS = 5
LONG = [(7 * i + 3) % VOCAB for i in range(CHUNKS * PREFILL_CHUNK - 5)]  # the last one short
PROMPT_CALLS = ("open", "extend")
CALL_S, TICK_S = 0.004, 1e-4  # a slow prompt call; the ticker's timer, due well before


def model() -> ToyDrafter:
    return ToyDrafter.preset(ToySpec(vocab=VOCAB, seed=3), "far")


class Logged(ToyDrafterEngine):
    """The toy's engine, each prompt call and row logged as (what, request, ids) in
    ``log``, which the test's ticker writes to as well."""

    def __init__(self, log: list) -> None:
        super().__init__(model())
        self.log = log
        self.failing: set[str] = set()  # prompt calls whose next one raises (once each)

    def open(self, request, committed) -> None:
        self._call("open", request, committed)
        super().open(request, committed)

    def extend(self, request, committed) -> None:
        self._call("extend", request, committed)
        super().extend(request, committed)

    def _call(self, what: str, request, committed) -> None:
        """Log a prompt call, or raise if it is planted to fail (not logged: it took no id)."""
        if what in self.failing:
            self.failing.discard(what)
            raise RuntimeError(f"planted: the device failed mid-{what}")
        self.log.append((what, request, len(committed)))

    def next_logits(self, request, token=None):
        self.log.append(("row", request, 0))
        return super().next_logits(request, token)


class Slow(Logged):
    """Each prompt call takes CALL_S, longer than the ticker's timer: it is due when the
    call ends."""

    def open(self, request, committed) -> None:
        time.sleep(CALL_S)
        super().open(request, committed)

    def extend(self, request, committed) -> None:
        time.sleep(CALL_S)
        super().extend(request, committed)


class Unreported(EngineProposer):
    """Planted: a prefill ahead whose pieces report no ids (its chunks run, uncounted)."""

    def prefill(self, key, prefix):
        with contextlib.closing(super().prefill(key, prefix)) as pieces:
            for _ in pieces:
                yield 0


def prefills_ended(read) -> dict[str, float]:
    """The worker's prefills ahead by how they ended (``pp1q_draft_prefills_total``),
    the outcomes that happened only; ``read(name, **labels)``: a Metrics' ``value``, or
    one over a scrape."""
    counts = {o.value: read("pp1q_draft_prefills_total", outcome=o.value)
              for o in PrefillOutcome}
    return {o: n for o, n in counts.items() if n}


def prompt_ids(log: list) -> int:
    """The ids every prompt call in ``log`` handed the drafter, all requests."""
    return sum(n for what, _, n in log if what in PROMPT_CALLS)


def prompt_calls(log: list, request) -> list[tuple[str, int]]:
    return [(what, n) for what, r, n in log if r == request and what in PROMPT_CALLS]


def check_interleaved(log: list, request, prompt: list[int]) -> None:
    """The prompt went in chunks of at most PREFILL_CHUNK ids, one open then extends,
    and the loop turned (a tick) between every two of them."""
    calls = prompt_calls(log, request)
    assert [n for _, n in calls] and sum(n for _, n in calls) == len(prompt), calls
    assert max(n for _, n in calls) <= PREFILL_CHUNK, calls
    assert [what for what, _ in calls] == ["open"] + ["extend"] * (len(calls) - 1), calls
    at = [i for i, (what, r, _) in enumerate(log) if r == request and what in PROMPT_CALLS]
    for a, b in zip(at, at[1:], strict=False):
        assert any(what == "tick" for what, _, _ in log[a + 1:b]), ("no loop turn", log[a:b])


async def ticker(log: list, every_s: float = 0.0) -> None:
    """A tick each loop turn, or each timer of ``every_s`` (a timer's task wakes a turn
    after it is due)."""
    while True:
        log.append(("tick", None, 0))
        await asyncio.sleep(every_s)


def chain(step, prefix) -> list[int]:
    """The toy chain's tokens for ``step`` (the engine's rows equal it: whole or chunked)."""
    return [t for t, _ in Proposer(model()).rows(step, prefix)]
