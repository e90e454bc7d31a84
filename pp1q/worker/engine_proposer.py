"""The worker's Proposer over an engine ``Drafter`` (pp1q.models.engine): real models.

Rows come from pp1q.models.proposal.propose, so each q is built from exactly the
logits the drafter returned and sampled with the STEP's PROPOSAL-domain draw, as the
toy chain does. A drafter request is kept per (session, slot) with its KV cache; a
STEP's committed prefix tells what the verifier committed since the last STEP: when it
is the drafter's committed tokens plus some accepted drafts plus one token, the drafter
commits that (its cache kept); the same prefix again (a RESET, a retried round) resets
the speculative tail; a longer prefix that begins with the drafter's committed tokens
otherwise (a prefill a RESET or a new STEP interrupted) extends it from there; any
other prefix (a new generation's context resent, say) closes and reopens the request
from it. Deriving it from the prefix, which the worker state already checked against
the STEP's digest, means a lost or reordered COMMIT can never leave the drafter on
another prefix than the one the verifier holds.

That bringing happens in ``prefill`` when a new context arrives, ahead of its first
STEP (the verifier's target prefills the same prompt meanwhile), and in ``prepare``
before a STEP's first row, from wherever a prefill stopped: a prefix is opened with its
first PREFILL_CHUNK ids and extended a chunk at a time, one yield after each chunk (of
its ids: the worker counts them, ``pp1q_draft_prefill_tokens_total``), so
StepDrafter gives the event loop back between two chunks (a 4,096-token prompt is
~20-30 s of SmolLM2-135M on a 2-core CPU: whole, it held every other slot's STEP, each
RESET and every read of the connection behind it, past the verifier's STEP watchdog).
What the drafter holds is recorded after each call, so a prefill stopped between two
chunks leaves it consistent and the next STEP resumes it.

Memory is bounded twice: by MAX_OPEN_REQUESTS requests, and by the bytes of their K/V
(``draft_kv_budget_bytes``, given by ``limit_memory``): past either, the least recently
used request not in use (mid-prefill or drafting) is dropped (its next STEP prefills it
again: exact, slower) and counted; a request whose growth would pass the budget with
nothing left to drop (every other one in use: mid-prefill or drafting) is dropped itself
and its STEP refused (``draft_kv_budget``), so that no number of sessions and slots,
each prefilling a long prompt at once, holds more. A session's requests are freed when
it ends (``forget``): request keys hold the session id, which is never reused.

The chunked prefill's logits are not bit-identical to a whole-prompt prefill's (the
float sums run in another order: ~1e-5 on SmolLM2), but exactness does not rest on them:
every q is built from exactly the logits the drafter returns, whatever they are, and a
prefix chunked the same way gives the same logits again (same tokens, same q).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator

import torch

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.q import DyadicRow
from pp1q.models.engine import PREFILL_CHUNK, Drafter
from pp1q.models.proposal import HostStaging, propose
from pp1q.runtime.settings import DEFAULT_DRAFT_KV_BUDGET
from pp1q.wire import Form, Step
from pp1q.wire.validate import step_form
from pp1q.worker.drafting import Proposer
from pp1q.worker.proposer import ProposalSpec

# drafter requests (KV caches) kept; beyond, the least recently used is freed, never one
# in use (mid-prefill or drafting: at most one a slot of a live session)
MAX_OPEN_REQUESTS = 256


class EngineProposer(Proposer):
    def __init__(self, drafter: Drafter) -> None:
        super().__init__(drafter)
        self.drafter = drafter
        self.staging = HostStaging()  # an accelerator's logits land in one pinned buffer
        # (session, slot) -> (committed tokens, drafts of the last proposal), LRU order
        self._held: collections.OrderedDict[tuple[int, int], tuple[list[int], list[int]]] = (
            collections.OrderedDict())
        # keys in use right now, with how many users: a prefill or a STEP's prepare
        # bringing them to a prefix, a STEP drafting rows from them (between two chunks or
        # rows the loop runs other STEPs): never dropped, or the prefill would restart and
        # the rows fail. A count, not a set: a stopped bringing closed after the next one
        # began must not unmark the key the next one holds
        self._busy: collections.Counter[tuple[int, int]] = collections.Counter()
        self._bytes: dict[tuple[int, int], int] = {}  # K/V held per request, at its last call
        self._total = 0  # their sum
        self._forgotten: set[tuple[int, int]] = set()  # session gone while in use
        self.kv_budget = DEFAULT_DRAFT_KV_BUDGET
        self._on_dropped: Callable[[], None] = _nothing

    def limit_memory(self, kv_budget_bytes: int, on_dropped: Callable[[], None]) -> None:
        self.kv_budget = int(kv_budget_bytes)
        self._on_dropped = on_dropped

    def forget(self, key) -> None:
        if key in self._busy:  # a cancelled STEP's prepare or rows end at its next await
            self._forgotten.add(key)
        elif key in self._held:
            self._drop(key)

    def prefill(self, key, prefix: list[int]) -> Iterator[int]:
        """A new context, ahead of its first STEP: brought as that STEP would bring it."""
        return self._bring(key, prefix)

    def prepare(self, step: Step, prefix: list[int]) -> Iterator[int]:
        return self._bring((step.session, step.slot), prefix)

    def _bring(self, key: tuple[int, int], prefix: list[int]) -> Iterator[int]:
        """Bring the drafter's request to ``prefix``, a yield after each prefill chunk
        (an ``open`` or an ``extend``, the last one's too) of the ids it handed the
        drafter; a commit or a reset is cheap and yields nothing. A prefix brought from
        nothing goes in PREFILL_CHUNK ids from its first, whoever brings it (a prefill
        ahead, a STEP); one brought from a held prefix goes on from there (a prefill
        ahead of P, then a STEP on P + [t]: P's chunks, then t alone), so its logits may
        differ in the last float bits from a prefill of the whole: every q is still
        built from the logits it had."""
        prefix = list(prefix)
        self._busy[key] += 1
        try:
            while True:
                ids = self._toward(key, prefix)
                done = len(self._held[key][0]) == len(prefix)
                if ids:
                    yield ids
                if done:
                    return
        finally:  # done, failed, or closed by a step that stopped (then evictable again)
            self._unbusy(key)

    def _unbusy(self, key: tuple[int, int]) -> None:
        self._busy[key] -= 1
        if not self._busy[key]:
            del self._busy[key]
            if key in self._forgotten:  # its session ended meanwhile
                self._forgotten.discard(key)
                self.forget(key)

    def _toward(self, key: tuple[int, int], prefix: list[int]) -> int:
        """One engine call toward ``prefix``, from what the drafter holds now (read
        afresh: another slot's STEP may have evicted it since the last call); after it,
        the committed tokens held are a prefix of ``prefix``. The ids of a prefill chunk
        (``open`` or ``extend``), else 0."""
        held = self._held.pop(key, None)  # back (as the most recent) once the call is done
        ids = 0
        try:
            if held is not None:
                committed, drafts = held
                extra = prefix[len(committed):]
                if prefix[: len(committed)] != committed:
                    self.drafter.close(key)  # not a continuation: reopen below
                    held = None
                elif not extra:
                    self.drafter.reset(key)  # same prefix, a retried or discarded round
                elif len(extra) - 1 <= len(drafts) and extra[:-1] == drafts[: len(extra) - 1]:
                    self.drafter.commit(key, len(extra) - 1, extra[-1])  # the verifier's
                    committed = prefix
                else:  # a prefill a RESET or a new STEP interrupted: go on from there
                    if drafts:
                        self.drafter.reset(key)  # extend is refused with drafts held
                    chunk = extra[:PREFILL_CHUNK]
                    self.drafter.extend(key, chunk)
                    committed, ids = committed + chunk, len(chunk)
            if held is None:
                committed = prefix[:PREFILL_CHUNK]
                self.drafter.open(key, committed)
                ids = len(committed)
        except BaseException:  # failed part-way: what it holds is unknown, start it over
            self._total -= self._bytes.pop(key, 0)
            self.drafter.close(key)
            raise
        self._held[key] = (committed, [])
        self._recount(key)
        self._fit(key)
        return ids

    def _fit(self, key: tuple[int, int]) -> None:
        """Drop the least recently used requests not in use (nor ``key``) while
        there are too many or their K/V pass the budget; past the budget with none left
        to drop, or with ``key`` alone past it (dropping the others would not make it
        fit), drop ``key`` itself and refuse its growth."""
        if self._bytes[key] > self.kv_budget:
            self._refuse(key)
        while len(self._held) > MAX_OPEN_REQUESTS or self._total > self.kv_budget:
            old = next((k for k in self._held if k not in self._busy and k != key), None)
            if old is None:
                break
            self._drop(old)
            self._on_dropped()
        if self._total > self.kv_budget:
            self._refuse(key)

    def _refuse(self, key: tuple[int, int]) -> None:
        mine, total = self._bytes[key], self._total
        self._drop(key)
        raise LocalProtocolError(
            Reason.DRAFT_KV_BUDGET, f"drafter K/V of {total} bytes ({mine} this request's) "
            f"past draft_kv_budget_bytes {self.kv_budget}")

    def _drop(self, key: tuple[int, int]) -> None:
        del self._held[key]
        self._total -= self._bytes.pop(key, 0)
        self.drafter.close(key)

    def rows(self, step: Step, prefix: list[int]) -> Iterator[tuple[int, DyadicRow | None]]:
        key, prefix = (step.session, step.slot), list(prefix)
        held = self._held.get(key)
        if held is None or held[1] or held[0] != prefix:  # prepare was not run (or undone)
            for _ in self.prepare(step, prefix):
                pass
        # the drafts the drafter holds, as it takes them: x_i with row i + 1's forward,
        # the last by ``append`` before it is yielded (both chains do); a STEP stopped
        # after k < depth rows (a RESET) leaves k - 1, and a later prefix that accepts the
        # k-th is extended
        drafts = self._held[key][1]
        prev = None
        self._busy[key] += 1  # the STEP awaits between rows: its request stays
        try:
            for i, (token, row) in enumerate(self._chain(step, key)):
                if prev is not None:
                    drafts.append(prev)
                if i + 1 == step.depth:
                    drafts.append(token)
                yield token, row
                prev = token
        finally:
            self._recount(key)  # the drafts' K/V, counted (the next call fits the budget)
            self._unbusy(key)

    def _recount(self, key: tuple[int, int]) -> None:
        if key in self._held:
            size = self.drafter.kv_bytes(key)
            self._total += size - self._bytes.get(key, 0)
            self._bytes[key] = size

    def _chain(self, step: Step, key: tuple[int, int]) -> Iterator[tuple[int, DyadicRow | None]]:
        """The STEP's (x_i, q_i): argmaxes for a v1 token-only STEP, else sampled rows."""
        if step_form(step) is Form.TOKEN_ONLY:
            prev = None
            for i in range(step.depth):
                token = int(torch.argmax(self.drafter.next_logits(key, prev)))  # lowest id on ties
                if i + 1 == step.depth:
                    self.drafter.append(key, token)
                yield token, None
                prev = token
            return
        spec = ProposalSpec(seed=step.seed, generation=step.generation, round_id=step.round_id,
                            first_position=step.first_position, depth=step.depth,
                            temperature=step.temperature, top_k=step.top_k or None)
        for draft in propose(self.drafter, key, spec, self.staging):
            yield draft.token, draft.row


def _nothing() -> None:
    pass
