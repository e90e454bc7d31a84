"""One STEP on the worker: draft rows in order, send each REPLY at once, COMPLETION last;
a sparse STEP that fits one frame (``sizes.proposal_fits``) leaves whole, as one
PROPOSAL, once its last row is drafted.

Runs as a task per STEP on the event loop. Between rows it yields once it has drafted
for YIELD_AFTER_S since it last did (or a loop tick's unsent frames reach
YIELD_AT_BYTES), so a RESET that arrives mid-proposal of a real model is processed
before the next row is drafted; after a RESET the endpoint refuses further sends for
that step and drafting stops. Fast rows send a whole STEP in one loop tick: a RESET
read after them finds the step complete, and the verifier, whose RESET invalidated the
generation, discards the late frames as stale. A STEP's frames leave as soon as its
COMPLETION (or its PROPOSAL) is written (one writelines), so the verifier checks one
proposal while the next is drafted; other frames leave at the end of the loop tick.
The proposal draw of row i is keyed by the STEP's (seed, generation, round,
first_position + i - 1): a retried STEP under the same keys would draw identical rows,
but the endpoint refuses a reused round outright, so a key is never drawn twice on one
session.

What the rows are is the ``Proposer``'s: the worker's one drafting seam. Before the first
row a STEP runs the proposer's ``prepare``: work in pieces (a real drafter's prefill of a
new prefix, in chunks of pp1q.models.engine.PREFILL_CHUNK ids), a loop turn after each
piece, and the step stops there once it is no longer live; so a long prompt does not
hold the other slots' STEPs, a RESET and every read of the connection behind it, and a
RESET mid-prefill stops it after the piece in hand. A slot's whole context (a CONTEXT
from position 0) starts its ``prefill``: the same kind of pieces, run ahead of the
slot's first STEP (the verifier sends a request's prompt before its own target prefills
it, so the two prefills run side by side, not one after the other), stopped by the
STEP, whose ``prepare`` goes on from the last piece done, or by a RESET. Each piece
yields the prompt ids it ran, counted here (``pp1q_draft_prefill_tokens_total``), and a
prefill ahead is counted once it ends, by how (``PrefillOutcome``:
``pp1q_draft_prefills_total``): a peer that sends whole CONTEXTs and no STEP makes the
drafter prefill, a bounded cost (a slot's new CONTEXT stops its last prefill), and this is
where an operator sees it. One stopped before its first piece ran did no work and is not
counted. It also hears when a proposal is discarded (``discard``). The toy chain is
stateless (no prefill: it counts none); ``EngineProposer`` (pp1q.worker.engine_proposer)
brings its KV cache to each STEP's committed prefix in ``prepare`` whatever a prefill
did, so a prefill stopped or lost can never leave it elsewhere. ``serve`` passes
``default_proposer`` (the toy chain, or ``EngineProposer`` for a real drafter) and a
planted-bug test a wrong q the same way (pp1q.worker.daemon.serve); the round benchmark
builds its connection with canned rows (pp1q.tools.bench.round_peer).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator

from pp1q.core.errors import Pp1qError, Reason
from pp1q.core.outcomes import PrefillOutcome
from pp1q.core.q import DyadicRow
from pp1q.models.toy import DraftModel
from pp1q.runtime.metrics import Metrics
from pp1q.wire import Form, Status, Step, WorkerEndpoint
from pp1q.wire.pool import ZeroRows
from pp1q.wire.sizes import proposal_fits
from pp1q.wire.validate import step_form
from pp1q.worker.proposer import ProposalSpec, propose, propose_greedy

log = logging.getLogger("pp1q.worker")

# A frame smaller than this is joined into one buffer before it is queued: copying a
# sparse REPLY (about 300 bytes) costs less than writing its three parts separately;
# a dense one (517 KB) leaves as (header, row), without the copy.
JOIN_BELOW_BYTES = 64 * 1024
# Drafting yields to the loop between rows once it has run this long since it last did:
# how long a RESET (or any input) may wait behind a proposal (plus the row in progress;
# each STEP drafted in the same tick adds its own). A real model's row takes longer,
# so it yields after every row; canned or tiny rows (~15 us) draft a whole STEP in one
# loop tick, its frames in one write instead of one per row.
YIELD_AFTER_S = 0.5e-3
# ... or once this many bytes wait for the tick's write: a dense row (517 KB) leaves
# before the next is built (the kernel sends it while we draft, and its reused row is
# free again), and what a tick holds unsent stays bounded; a sparse round is ~7 KB.
YIELD_AT_BYTES = 64 * 1024
# After each piece of a Proposer's ``prepare`` (a prefill chunk, ~0.5 s of a real model)
# the task sleeps this long, a timer rather than sleep(0): what the piece kept waiting (a
# read, the task a STEP it read starts, a timer due) runs before the next piece. After a
# sleep(0) the next piece ran first (asyncio and uvloop alike: the drafting task is
# ahead of them in the ready queue), so a STEP read during a piece waited two.
PIECE_PAUSE_S = 1e-6


class Proposer:
    """A STEP's rows after the committed prefix: (x_i, q_i) for i = 1..depth, in order,
    each as soon as it exists (q_i None for a v1 greedy STEP)."""

    def __init__(self, model: DraftModel) -> None:
        self.model = model

    def prefill(self, key, prefix: list[int]) -> Iterator[int]:
        """A whole committed context for ``key`` (session, slot) arrived: work to do ahead
        of the slot's first STEP, in pieces as ``prepare``'s (one yield after each, of the
        prompt ids it ran: counted in ``pp1q_draft_prefill_tokens_total``). The
        worker runs them while the verifier's target prefills the same prompt, until the
        slot's STEP (whose ``prepare`` takes over from the last piece done), a RESET or the
        connection's end stops them. The toy model is stateless (each row reads the
        prefix): none."""
        return iter(())

    def discard(self, key) -> None:
        """``key``'s proposal was discarded (RESET): drop state past the committed prefix."""

    def forget(self, key) -> None:
        """``key``'s session ended: free what is held for it (a session id is never
        reused). The toy keeps nothing between rows."""

    def limit_memory(self, kv_budget_bytes: int, on_dropped: Callable[[], None]) -> None:
        """The worker's bound on the drafter's K/V (``draft_kv_budget_bytes``), and what to
        call for each request dropped to keep it. The toy keeps none."""

    def prepare(self, step: Step, prefix: list[int]) -> Iterator[int]:
        """Work to do before the STEP's first row, one yield after each piece, of the
        prompt ids it ran (the drafter may stop between two pieces, and a later STEP's
        ``prepare`` takes over from the last piece done). The toy chain has none."""
        return iter(())

    def rows(self, step: Step, prefix: list[int]) -> Iterator[tuple[int, DyadicRow | None]]:
        if step_form(step) is Form.TOKEN_ONLY:
            for token in propose_greedy(self.model, prefix, step.depth):
                yield token, None
            return
        spec = ProposalSpec(seed=step.seed, generation=step.generation, round_id=step.round_id,
                            first_position=step.first_position, depth=step.depth,
                            temperature=step.temperature, top_k=step.top_k or None)
        yield from propose(self.model, prefix, spec)


@dataclasses.dataclass(eq=False)
class Ahead:
    """A prefill ahead of a slot's first STEP: the proposer's pieces, the task running
    them, and whether a piece ran (counted once it ends, if one did)."""

    pieces: Iterator[int]
    task: asyncio.Task | None = None
    ran: bool = False


class StepDrafter:
    """Drafts the STEPs of one wire connection."""

    def __init__(self, endpoint: WorkerEndpoint, proposer: Proposer,
                 metrics: Metrics, write: Callable[[bytes], None],
                 writable: Callable[[], asyncio.Future | None],
                 drained: Callable[[], bool] = lambda: False,
                 queued: Callable[[], int] = lambda: 0,
                 write_now: Callable[[bytes], None] | None = None) -> None:
        self.endpoint, self.metrics = endpoint, metrics
        self.proposer = proposer
        self._write = write
        self._writable = writable  # None when the transport accepts more, else a future
        self._drained = drained  # True: every byte written so far has left our buffers
        self._queued = queued  # bytes written this loop tick, not yet handed to the transport
        # a step's last frame: handed to the transport now with what is queued before it,
        # not at the tick's end (None: queued with the others)
        self._write_now = write if write_now is None else write_now
        self.tasks: dict[int, asyncio.Task] = {}
        # slot -> its prefill ahead of the slot's first STEP, while it runs
        self.prefills: dict[int, Ahead] = {}
        # dense REPLYs leave as (header, row) without a join copy (30-50 us a row): a
        # row is filled again only once the transport no longer holds it
        self._dense_rows = ZeroRows()

    def start(self, step: Step) -> None:
        # the step's prepare goes on from where the prefill stopped, and counts it
        ahead = self._halt_prefill(step.slot)
        task = asyncio.get_running_loop().create_task(self._run(step, ahead))
        self.tasks[step.slot] = task
        task.add_done_callback(lambda t, slot=step.slot: self._done(slot, t))

    def start_prefill(self, key, prefix: list[int]) -> None:
        """Run the proposer's ``prefill`` of a whole context that arrived for ``key``
        (session, slot) on the loop, a pause after each piece, until the slot's STEP, a
        RESET or the connection's end stops it. A slot whose STEP is live (a verifier
        that resent its context mid-step) is left to that STEP's own ``prepare``."""
        slot = key[1]
        self._stop_prefill(slot, PrefillOutcome.SUPERSEDED)
        if slot in self.tasks:
            return
        # a copy of the prefix: COMMITs extend the held one
        ahead = Ahead(self.proposer.prefill(key, list(prefix)))
        ahead.task = asyncio.get_running_loop().create_task(self._prefill(slot, ahead))
        self.prefills[slot] = ahead

    def cancel(self, slot: int) -> None:
        """The slot was RESET: its prefill and its STEP stop."""
        self._stop_prefill(slot, PrefillOutcome.RESET)
        task = self.tasks.pop(slot, None)
        if task is not None:
            task.cancel()

    def cancel_all(self) -> None:
        """The connection ended: every prefill and STEP of it stops."""
        for slot in list(self.prefills):
            self._stop_prefill(slot, PrefillOutcome.CLOSED)
        for slot in list(self.tasks):
            self.cancel(slot)

    def _stop_prefill(self, slot: int, outcome: PrefillOutcome) -> None:
        """Stop the slot's prefill now (``_halt_prefill``), counted as ``outcome``."""
        self._ahead_ended(self._halt_prefill(slot), outcome)

    def _halt_prefill(self, slot: int) -> Ahead | None:
        """Stop the slot's prefill now, between two pieces (each runs whole in one loop
        callback): its pieces are closed here, not when the cancelled task next runs, so
        a STEP started next finds the drafter's bookkeeping settled. Not counted yet."""
        ahead = self.prefills.pop(slot, None)
        if ahead is not None:
            ahead.task.cancel()
            close = getattr(ahead.pieces, "close", None)
            if close is not None:
                close()
        return ahead

    def _ahead_ended(self, ahead: Ahead | None, outcome: PrefillOutcome) -> None:
        if ahead is not None and ahead.ran:  # one stopped before its first piece: no work
            self.metrics.prefill_ended(outcome)

    async def _prefill(self, slot: int, ahead: Ahead) -> None:
        """Run ``ahead``'s pieces, the loop turning after each; a stop cancels this at
        its pause (counted by ``_stop_prefill``), an end by itself is counted here."""
        outcome = PrefillOutcome.COMPLETED
        try:
            for ids in ahead.pieces:  # a piece done (a prefill chunk): the loop turns next
                self.metrics.draft_prefill_tokens.inc(ids)
                ahead.ran = True
                await asyncio.sleep(PIECE_PAUSE_S)
        except Exception as e:  # the drafter's failure: the slot's STEP prepares again from
            # what it holds (a failed call closes the request), failing closed if it fails
            outcome = PrefillOutcome.FAILED
            reason = e.reason if isinstance(e, Pp1qError) else Reason.DRAFTER_FAILED
            self.metrics.logs.log(log, logging.WARNING, ("prefill", reason),
                                  "prefilling slot %d failed: %s", slot, str(e) or repr(e),
                                  exc_info=None if isinstance(e, Pp1qError) else e)
        if self.prefills.get(slot) is ahead:  # else stopped meanwhile, and counted then
            del self.prefills[slot]
            if ahead.ran or outcome is PrefillOutcome.FAILED:  # a failure counts, ran or not
                self.metrics.prefill_ended(outcome)

    def detach(self) -> None:
        """The connection is gone: drop its hooks (bound to it: a reference cycle)."""
        self._write, self._writable, self._drained = _drop, _always_writable, _never
        self._queued, self._write_now = _nothing, _drop

    def _done(self, slot: int, task: asyncio.Task) -> None:
        if self.tasks.get(slot) is task:
            del self.tasks[slot]
        if not task.cancelled() and task.exception() is not None:
            log.error("drafting task failed", exc_info=task.exception())

    async def _run(self, step: Step, ahead: Ahead | None = None) -> None:
        """Draft ``step``. ``ahead``: the slot's prefill it stopped, counted here once the
        step's prepare is done: ``completed`` where it left the prepare nothing to do (its
        last piece ran, its end not yet seen: a STEP read during the last chunk),
        ``taken_over`` where the prepare ran pieces, or the step stopped first."""
        t0 = time.perf_counter()
        ep = self.endpoint
        self.metrics.steps.inc()
        # the endpoint checked last_committed and prefix_digest against this before
        # handing the STEP out; COMMIT (which extends it) cannot arrive while we draft
        prefix = ep.context(step.slot)
        form = step_form(step)  # one form for every REPLY of the step
        whole = proposal_fits(step, ep.limits)  # one PROPOSAL at the end: rows kept till then
        tokens: list[int] = []
        rows: list[DyadicRow | None] = []
        # a RESET, a lost connection or a close reaches the endpoint only in another loop
        # callback, so the step can stop being live only across an await (or before we
        # first ran): check again only then
        try:
            if not ep.is_live(step.slot, step.generation, step.round_id):
                return  # reset before we first ran: not even a piece of prefill for it
            left = False  # whether the prefill ahead left the prepare a piece to run
            for ids in self.proposer.prepare(step, prefix):  # a piece done (a prefill chunk)
                left = True
                self.metrics.draft_prefill_tokens.inc(ids)
                await asyncio.sleep(PIECE_PAUSE_S)  # the other slots' STEPs and input run
                if not ep.is_live(step.slot, step.generation, step.round_id):
                    return  # the next STEP for this slot takes over where this one stopped
            self._ahead_ended(ahead, PrefillOutcome.TAKEN_OVER if left
                              else PrefillOutcome.COMPLETED)
            ahead = None
            resumed, awaited = time.perf_counter(), False
            for index, (token, row) in enumerate(self.proposer.rows(step, prefix), start=1):
                if awaited and not ep.is_live(step.slot, step.generation, step.round_id):
                    return  # reset (or connection gone) while drafting: send nothing more
                awaited = False
                if whole:
                    tokens.append(token)
                    rows.append(row)
                else:
                    dense_row = (self._dense_rows.take(self._drained())
                                 if form is Form.DENSE else None)
                    self._send(ep.send_row(step, index, token, row, form, dense_row))
                waiter = self._writable()
                if waiter is not None:
                    await waiter  # the peer reads slower than we draft: back-pressure
                    resumed, awaited = time.perf_counter(), True
                elif (time.perf_counter() - resumed >= YIELD_AFTER_S
                      or self._queued() >= YIELD_AT_BYTES):
                    await asyncio.sleep(0)  # let a RESET for this slot in before the next row
                    resumed, awaited = time.perf_counter(), True
            if not ep.is_live(step.slot, step.generation, step.round_id):
                return
            last = (ep.send_proposal(step, tokens, rows) if whole
                    else ep.send_completion(step.slot))
        except Pp1qError as e:  # the drafter failed or the endpoint refused a row: abort
            # a verifier's STEP can cause it every round (a tiny temperature): counted
            # (drafting aborts), logged once a reason per interval
            self.metrics.logs.log(log, logging.WARNING, ("drafting", e.reason),
                                  "drafting slot %d failed: %s", step.slot, str(e))
            self._abort(step, e.reason)
            return
        except Exception:  # the drafter's own failure (a model's runtime error): fail closed
            log.exception("drafter failed on slot %d", step.slot)
            self._abort(step, Reason.DRAFTER_FAILED)
            return
        finally:  # stopped (or failed) before its prepare was done: the STEP took it over
            self._ahead_ended(ahead, PrefillOutcome.TAKEN_OVER)
        # the whole proposal leaves now: the verifier checks it while we draft the next
        self._write_now(last)
        self.metrics.round_latency.observe(time.perf_counter() - t0)

    def _abort(self, step: Step, reason: Reason) -> None:
        self.metrics.drafting_aborts.labels(reason=Reason(reason).value).inc()
        ep = self.endpoint
        if ep.is_live(step.slot, step.generation, step.round_id):
            self._write(ep.send_completion(step.slot, Status.ABORTED, Reason(reason)))

    def _send(self, parts) -> None:
        if len(parts) == 1:  # a frame in one buffer already (a sparse REPLY)
            self._write(parts[0])
            return
        if sum(len(p) for p in parts) < JOIN_BELOW_BYTES:
            parts = (b"".join(parts),)
        for part in parts:  # the connection writes a loop tick's parts in one writelines
            self._write(part)


def _drop(_data: bytes) -> None:
    """Where a detached drafter's frames go: the connection is closed."""


def _always_writable() -> None:
    return None


def _never() -> bool:
    return False


def _nothing() -> int:
    return 0
