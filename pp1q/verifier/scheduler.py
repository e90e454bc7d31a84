"""The verifier's scheduler: request slots, rounds, fail-closed fallback.

Each request holds one of ``slots`` slots for its lifetime and runs rounds of fixed
depth. A speculative request's prompt goes to the worker (CONTEXT) before the target
prefills it, so the worker's drafter prefills beside it. A round sends a STEP (the link
batches STEPs and bounds batches in flight),
waits for a validated proposal and hands it to the scheduler's ``Decider``
(pp1q.verifier.decider: target rows and the accept/reject rule, in one process or
across a rank group; the scheduler is the same either way). When the proposal fails
(timeout, corruption, missing q, refusal, lost connection, no worker) the generation is
invalidated first (RESET), the whole proposal is discarded and exactly one target-only
token is drawn from the committed prefix; the next round starts a new generation. The
worker keeps the committed prefix over a RESET: the next round's CONTEXT carries only
the token(s) it lacks. Only the worker's refusal of a STEP for its context (digest,
position, none held), or a new session, makes the next round send the whole context.
Nothing of a proposal is committed unless every row of it validated. Refusals are
domain errors (ServiceError: queue full, generations exhausted; the decider's own),
never HTTP statuses.

Keys: a speculative round and its fallback use (seed, slot generation, round id);
generations grow per slot for the daemon's life, so a key is never reused across
sessions. A ``speculative: false`` request uses generation 0 and round = step index,
so its output is a pure function of (prompt, seed, draw secret): the verifier's draws are
keyed by its draw seed (pp1q.core.drawkey), the worker's PROPOSAL draws by the seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from pp1q.core.errors import Reason, ServiceError
from pp1q.core.outcomes import FallbackCause, StepKind
from pp1q.core.verify import RoundKeys
from pp1q.models.text import TextCodec
from pp1q.runtime.metrics import Metrics
from pp1q.verifier import rounds
from pp1q.verifier.api import GenerateRequest, finish
from pp1q.verifier.decider import Decider
from pp1q.verifier.job import TARGET_ONLY_GENERATION, Job
from pp1q.verifier.link import Fallback, WorkerLink
from pp1q.verifier.slot_pool import NO_ADDRESS, SlotPool
from pp1q.wire import Commit, Step
from pp1q.wire.events import ProposalReady

MAX_GENERATION = (1 << 24) - 1  # the wire's generation field and the RNG counter are 24-bit
# after the drain deadline a request still running ends at its next round; this long is
# one round at worst with the toy's default watchdog (2 s; a real model's is 20 s) and a
# slow target step
CUT_GRACE_S = 10.0
# the worker refused a STEP because its copy of the context is not ours: resend it whole
CONTEXT_LOST = frozenset({Reason.CHECKSUM_MISMATCH, Reason.BAD_POSITION, Reason.NO_CONTEXT})


@dataclass(frozen=True)
class Drained:
    """What a drain did: requests that finished, were cut at the deadline, were queued."""

    finished: int
    cut: int
    queued: int


class Scheduler:
    def __init__(self, link: WorkerLink, decider: Decider, metrics: Metrics, *, slots: int,
                 depth: int, text: TextCodec | None = None,
                 max_positions: int | None = None, queued_per_address: int = 0) -> None:
        self.link, self.decider, self.metrics = link, decider, metrics
        self.text = text  # the target's tokenizer (None: the toy has none)
        self.max_positions = max_positions  # the target's context (None: no bound of its own)
        self.depth = depth
        self.pool = SlotPool(slots, metrics, queued_per_address)
        self._generation = [TARGET_ONLY_GENERATION] * slots
        self.stopping = False  # drain(): no request is taken any more
        self._cut = False  # the drain deadline passed: running requests end at their next round
        self._running = 0  # requests holding a slot
        self._idle = asyncio.Event()  # set while none is running
        self._idle.set()

    # -- requests ----------------------------------------------------------------

    async def generate(self, req: GenerateRequest,
                       on_tokens: Callable[[list[int]], bool] | None = None,
                       address: str = NO_ADDRESS) -> dict:
        """Run ``req`` to completion. ``on_tokens(new)`` is called with each round's
        committed tokens as they are committed (streaming); a true return ends the
        request after that round (finish_reason "stop": the caller saw a stop token).
        ``address``: the client's (pp1q.runtime.address_counts.client_address), whose
        share of the queue and of freed slots it counts against."""
        t0 = time.perf_counter()
        try:
            if self.stopping:
                raise ServiceError(Reason.STOPPING, "the verifier is stopping; retry elsewhere")
            slot = await self.pool.acquire(address)
        except ServiceError as e:  # answered 503 (busy, stopping) before it took a slot
            self.metrics.request_refused(e.reason)
            raise
        except asyncio.CancelledError:  # its client left while it waited for a slot
            self.metrics.requests.labels(outcome="left_queued").inc()
            raise
        job = Job(req, slot)
        start, shown, stopped = len(req.prompt), 0, False
        self._running += 1
        self._idle.clear()
        try:
            self._context_ahead(job)
            await self.decider.open(job)
            while job.produced < req.max_tokens and not job.stopped and not stopped:
                if self._cut:
                    raise ServiceError(Reason.STOPPING,
                                       "the verifier stopped: the drain deadline passed")
                if req.speculative:
                    await self._speculative_step(job)
                else:
                    await self._target_only_step(job, job.generation, job.next_round(), None)
                if on_tokens is not None:  # stream what the answer will hold, no further
                    upto, _ = finish(job.prefix.tokens[start:], req.max_tokens, req.stop_ids)
                    stopped = bool(on_tokens(upto[shown:]))
                    shown = len(upto)
        except BaseException:
            self.metrics.requests.labels(outcome="error").inc()
            raise
        finally:
            self._release(job)
            self._running -= 1
            if not self._running:
                self._idle.set()
        self.metrics.requests.labels(outcome="ok").inc()
        tokens, reason = finish(job.prefix.tokens[start:], req.max_tokens, req.stop_ids)
        if stopped:  # the caller saw a stop (a stop string, say) in what was streamed
            tokens, reason = tokens[:shown], "stop"
        answer = {"token_ids": tokens, "seed": req.seed, "finish_reason": reason,
                  "prompt_tokens": len(req.prompt), "stats": job.stats.as_json(),
                  "elapsed_s": round(time.perf_counter() - t0, 6)}
        if req.text and self.text is not None:
            answer["text"] = self.text.decode(tokens[:-1] if reason == "stop" else tokens)
        return answer

    async def drain(self, timeout: float) -> Drained:
        """Stop taking requests: queued ones fail at once (503 ``stopping``), running ones
        may finish within ``timeout``; those still running then end at their next round
        (503 ``stopping``, or the stream's error event)."""
        self.stopping = True
        queued = self.pool.refuse_waiters(
            ServiceError(Reason.STOPPING, "the verifier is stopping; retry elsewhere"))
        running = self._running
        cut = 0
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            self._cut, cut = True, self._running
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), CUT_GRACE_S)
        return Drained(finished=running - cut, cut=cut, queued=queued)

    def _release(self, job: Job) -> None:
        self.decider.close(job)  # first: a rank group queues CLOSE before any reuse
        if job.generation != TARGET_ONLY_GENERATION and job.context_session is not None:
            self.link.reset(job.slot, job.generation, Reason.CANCELLED)  # drop worker state
        self.pool.release(job.slot)

    def _new_generation(self, job: Job) -> None:
        g = self._generation[job.slot] + 1
        if g > MAX_GENERATION:
            raise ServiceError(Reason.GENERATIONS_EXHAUSTED,
                               f"slot {job.slot} exhausted its 24-bit generations")
        self._generation[job.slot] = job.generation = g
        job.stepped = False

    # -- one step of a speculative request -----------------------------------------

    async def _speculative_step(self, job: Job) -> None:
        link = self.link
        if job.generation == TARGET_ONLY_GENERATION:
            self._new_generation(job)
        if not link.ready:
            await self._fallback(job, Fallback(FallbackCause.WORKER_UNAVAILABLE,
                                               Reason.CONNECTION_LOST), job.next_round())
            return
        if link.circuit_open():  # the worker hung K rounds in a row: no STEP, no waiting
            await self._fallback(job, Fallback(FallbackCause.CIRCUIT_OPEN, Reason.STEP_TIMEOUT,
                                               "circuit open"), job.next_round())
            return
        if not self._round_fits(job):
            await self._target_only_step(job, job.generation, job.next_round(), None)
            return
        if not self._send_context(job):
            await self._fallback(job, Fallback(FallbackCause.WORKER_UNAVAILABLE,
                                               Reason.CONNECTION_LOST), job.next_round())
            return
        round_id = job.next_round()
        req = job.req
        last_committed = job.prefix.last_position
        step = Step(session=job.context_session, slot=job.slot, generation=job.generation,
                    round_id=round_id, last_committed=last_committed,
                    first_position=last_committed + 1,
                    prefix_digest=job.prefix.digest, depth=self.depth,
                    temperature=0.0 if req.greedy else req.draft_temperature,
                    top_k=0 if req.greedy or req.top_k is None else req.top_k,
                    context_version=0 if req.greedy else req.processors.context_version,
                    seed=req.seed)
        t0 = time.perf_counter()
        job.stepped = True
        outcome = await link.propose(step)
        if isinstance(outcome, Fallback):
            await self._fallback(job, outcome, round_id)
            return
        if not outcome.greedy and not rounds.proposal_matches(
                outcome.q_rows, outcome.draft_ids,
                RoundKeys(req.seed, step.generation, step.round_id, step.first_position)):
            self.metrics.validation_failure(Reason.PROPOSAL_MISMATCH)
            await self._fallback(job, Fallback(FallbackCause.INVALID_REPLY,
                                               Reason.PROPOSAL_MISMATCH), round_id)
            return
        await self._verify(job, step, outcome)
        self.metrics.round_latency.observe(time.perf_counter() - t0)

    def _round_fits(self, job: Job) -> bool:
        """False for a round the worker could not hold, or whose drafts the target would
        read past its context (the request fits it, its last rounds' depth may not)."""
        return not (len(job.prefix) + self.depth + 1 > self.link.max_context
                    or self.max_positions is not None
                    and len(job.prefix) + self.depth > self.max_positions)

    def _send_context(self, job: Job) -> bool:
        """Give the worker what it lacks of the job's committed prefix; False when the
        link could not send it (a refusal comes back on the STEP that follows)."""
        link = self.link
        if job.context_session != link.session:  # a new session holds nothing of ours
            job.context_session, job.worker_holds = link.session, 0
        if job.worker_holds < len(job.prefix):
            if not link.send_context(job.slot, job.generation, job.prefix, job.worker_holds):
                return False
            job.worker_holds = len(job.prefix)
        return True

    def _context_ahead(self, job: Job) -> None:
        """Send a speculative request's prompt to the worker before the target prefills
        it: the worker's drafter prefills it meanwhile (pp1q.worker.drafting), so the
        first round waits for the longer of the two prefills, not their sum, and a long
        prompt's first STEP is not the drafter's whole prefill against the watchdog.
        Nothing is sent when the first round would not speculate anyway; a send that
        fails is the first round's to retry."""
        if not (job.req.speculative and self.link.ready and self._round_fits(job)
                and not self.link.circuit_open()):
            return
        self._new_generation(job)
        self._send_context(job)

    async def _verify(self, job: Job, step: Step, ready: ProposalReady) -> None:
        drafts = list(ready.draft_ids)
        out, kind = await self.decider.decide_round(job, step, ready)
        committed = step.last_committed + out.accepted + 1
        sent = self.link.commit(Commit(session=step.session, slot=step.slot,
                                       generation=step.generation, round_id=step.round_id,
                                       accepted=out.accepted, token=out.token,
                                       committed=committed))
        self._append(job, drafts[: out.accepted] + [out.token])
        if sent:  # the worker appends the same tokens from the COMMIT
            job.worker_holds = len(job.prefix)
        s, m = job.stats, self.metrics
        s.rounds += 1
        s.drafted += len(drafts)
        s.accepted += out.accepted
        m.rounds.labels(kind=kind.value).inc()
        m.drafted_tokens.inc(len(drafts))
        m.accepted_tokens.inc(out.accepted)
        m.accepted_length.observe(out.accepted)

    # -- fallback ------------------------------------------------------------------

    async def _fallback(self, job: Job, why: Fallback, round_id: int) -> None:
        """Invalidate first, discard everything proposed, one target-only token."""
        old_generation = job.generation
        if job.stepped:  # else no proposal of this generation was ever possible
            if self.link.reset(job.slot, old_generation, why.reason):
                self.metrics.generation_invalidations.inc()
            await self.decider.invalidate(job, old_generation, why.reason)
        self._new_generation(job)
        if why.cause is FallbackCause.WORKER_REFUSED and why.reason in CONTEXT_LOST:
            job.worker_holds = 0  # its copy differs from ours: the next round resends it all
        job.stats.fallbacks[why.cause.value] += 1
        self.metrics.fallback(why.cause)
        await self._target_only_step(job, old_generation, round_id, StepKind.FALLBACK)

    async def _target_only_step(self, job: Job, generation: int, round_id: int,
                                kind: StepKind | None) -> None:
        out = await self.decider.decide_target_only(job, generation, round_id)
        self._append(job, [out.token])
        job.stats.target_only_steps += 1
        self.metrics.rounds.labels(kind=(kind or StepKind.TARGET_ONLY).value).inc()

    # -- shared ------------------------------------------------------------------

    def _append(self, job: Job, tokens: list[int]) -> None:
        job.prefix.extend(tokens)
        job.produced += len(tokens)
        if not job.stopped and not job.req.stop_ids.isdisjoint(tokens):
            job.stopped = True  # the answer ends at the first stop id (api.finish)
        self.metrics.generated_tokens.inc(len(tokens))
