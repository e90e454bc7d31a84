"""A Decider over an engine ``Target`` (pp1q.models.engine): real models' verifier path.

Scoring is batched across requests the way continuous batching does it: while one
forward runs (on the decider's single engine thread), every request whose proposal
arrives queues; when the forward ends, all queued requests go into the next
``Target.score`` call together. One thread owns the engine, so its per-request caches
are never touched concurrently and the event loop keeps serving the wire meanwhile.

The sampled rounds whose forward ended together are decided together too: each hands its
p to the decider's ``RoundBatch`` (pp1q.verifier.round_batch), one
``KernelRounds.sampled`` call for the rounds of a loop tick, as KernelDecider decides
the toy's, on the target's device (``Target.device``, where its logits are): p is made
there and read there, never copied to the host (a CUDA target decides with the torch lazy
step; a CPU one with numba where it is chosen, reading the tensor's own memory). Each
decision ends the request's round on the engine at once:
``commit(accepted, token)`` keeps the accepted drafts and the correction/bonus token in
the KV cache and rolls back the rest, so the engine's committed tokens always equal the
job's prefix. p is the request's processed target row (pp1q.models.processors), the same
function for rounds and for target-only steps.

A prompt is prefilled in chunks of ``prefill_chunk`` ids (``PREFILL_CHUNK`` of
pp1q.models.engine, the worker's chunk too; ``Target.open`` then ``Target.extend``),
each a call of its own on the engine thread: the rounds other requests queued meanwhile
run between two chunks, each to its commit before the next chunk, instead of after the
whole prompt (4,096 ids of SmolLM2-135M are ~25 s of this 2-core CPU, its 8,192
positions over a minute), and a request whose client leaves (its task cancelled) stops
after the chunk in hand.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import ConfigError
from pp1q.core.outcomes import StepKind
from pp1q.core.q import DyadicRow
from pp1q.core.verify import RoundKeys
from pp1q.models.engine import PREFILL_CHUNK, Target, make_current
from pp1q.models.processors import Processors
from pp1q.verifier import rounds
from pp1q.verifier.decider import Decider
from pp1q.verifier.job import Job
from pp1q.verifier.kernel_rounds import KernelRounds
from pp1q.verifier.round_batch import RoundBatch
from pp1q.wire import Step
from pp1q.wire.events import ProposalReady


def round_p(processors: Processors, greedy: bool, logits: torch.Tensor) -> torch.Tensor:
    """The rows a decision reads from the target's logits [rows, V], on their device:
    the logits widened (greedy: argmax only), else p after the request's processors."""
    if greedy:
        return logits.double()
    return processors.probs(logits)


class EngineDecider(Decider):
    def __init__(self, target: Target, *, slots: int, depth: int, draws: DrawKeys,
                 target_delay_s: float = 0.0, prefill_chunk: int = PREFILL_CHUNK) -> None:
        self.target = target
        self.prefill_chunk = prefill_chunk
        self.draws = draws  # the verifier's own draw keys (pp1q.core.drawkey)
        # the target's calls (open, score, commit, close) run in this thread, so its GPU
        # is this thread's current one too; p and the decisions run on the event loop's
        # thread, which loaded the model (pp1q.models.serving._load made it current)
        self._engine = ThreadPoolExecutor(1, thread_name_prefix="pp1q-target",
                                          initializer=make_current, initargs=(target.device,))
        self._queue: list[tuple[int, list[int], asyncio.Future]] = []
        self._draining = False
        # slot -> done when its round in hand has committed (a prefill's next chunk waits)
        self._rounds: dict[int, asyncio.Future] = {}
        self.forwards = 0  # Target.score calls (metrics and benchmarks)
        self.scored = 0  # request rows scored by them
        # the sampled rounds of a tick, one call, where the target's logits are
        self.batch = RoundBatch(KernelRounds(target.device))

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._engine, fn, *args)

    async def _score(self, slot: int, drafts: list[int]) -> torch.Tensor:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((slot, drafts, fut))
        if not self._draining:
            self._draining = True
            asyncio.get_running_loop().create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    rows = await self._call(self.target.score, [(s, d) for s, d, _ in batch])
                except Exception as e:  # every waiter of the batch sees the failure
                    for _, _, fut in batch:
                        if not fut.done():
                            fut.set_exception(e)
                    continue
                self.forwards += 1
                self.scored += len(batch)
                for (_, _, fut), r in zip(batch, rows, strict=True):
                    if not fut.done():
                        fut.set_result(r)
        finally:
            self._draining = False

    def _p(self, job: Job, logits: torch.Tensor) -> torch.Tensor:
        if logits.device != self.batch.kernel.device:  # an engine misnaming its device
            raise ConfigError(f"target {self.target.identity} names its device "
                              f"{self.batch.kernel.device} (Target.device) but its logits "
                              f"are on {logits.device}", key="device")
        return round_p(job.req.processors, job.req.greedy, logits)

    def verify_proposal(self, p: torch.Tensor, q_rows: Sequence[DyadicRow], drafts: list[int],
                        keys: RoundKeys) -> rounds.Outcome:
        """Standard verification of one round alone: what ``decide_round``'s batch runs
        for a batch of one (``pp1q bench profile`` times it: one request)."""
        return rounds.sampled(p, q_rows, drafts, keys, kernel=self.batch.kernel)

    @contextlib.contextmanager
    def _round(self, slot: int):
        """A round of ``slot`` from its forward asked for to its commit done."""
        done = asyncio.get_running_loop().create_future()
        self._rounds[slot] = done
        try:
            yield
        finally:
            if self._rounds.get(slot) is done:
                del self._rounds[slot]
            done.set_result(None)

    async def open(self, job: Job) -> None:
        prompt, n = list(job.prefix.tokens), self.prefill_chunk
        await self._call(self.target.open, job.slot, prompt[:n])
        for i in range(n, len(prompt), n):  # a cancellation ends it at the next chunk
            # the rounds begun meanwhile commit first: a round's commit is a call of its
            # own, which would otherwise queue behind the next chunk (a round a chunk
            # later). One round each, so neither side waits for ever.
            if self._rounds:
                await asyncio.wait(list(self._rounds.values()))
            await self._call(self.target.extend, job.slot, prompt[i:i + n])

    async def decide_round(self, job: Job, step: Step,
                           ready: ProposalReady) -> tuple[rounds.Outcome, StepKind]:
        drafts = list(ready.draft_ids)
        with self._round(job.slot):
            p = self._p(job, await self._score(job.slot, drafts))
            if ready.greedy:  # v1: an argmax on the target's device, only the ids cross
                out = rounds.greedy(p, drafts)
            else:
                keys = RoundKeys(self.draws.seed_for(job.req.seed), step.generation,
                                 step.round_id, step.first_position)
                out = await self.batch.decide(p, ready.q_rows, drafts, keys)
            await self._call(self.target.commit, job.slot, out.accepted, out.token)
        return out, StepKind.GREEDY if ready.greedy else StepKind.SPECULATIVE

    async def decide_target_only(self, job: Job, generation: int,
                                 round_id: int) -> rounds.Outcome:
        with self._round(job.slot):
            p = self._p(job, await self._score(job.slot, []))
            out = rounds.target_only(p[0], self.draws.seed_for(job.req.seed), generation,
                                     round_id, len(job.prefix.tokens), job.req.greedy,
                                     kernel=self.batch.kernel)
            await self._call(self.target.commit, job.slot, 0, out.token)
        return out

    def close(self, job: Job) -> None:
        self._engine.submit(self.target.close, job.slot)  # queued after its last call
