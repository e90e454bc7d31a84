"""The worker daemon in-process, driven by a scripted verifier over real loopback TCP:
rows in order and exact, a retried STEP never redrawn, the context on the same connection
(CONTEXT, COMMIT appends), a RESET of a discarded proposal keeps the committed prefix and
a RESET ``cancelled`` drops it."""

from __future__ import annotations

import asyncio

import pytest
from worker_harness import TIMEOUT_S, session, set_context

from pp1q.core.prefix import Prefix
from pp1q.models.toy import toy_pair
from pp1q.runtime.settings import WorkerSettings
from pp1q.wire import (
    Commit,
    Completion,
    FrameDecoder,
    HelloAnswer,
    Proposal,
    Refusal,
    Reply,
    Reset,
    Step,
    encode,
)
from pp1q.wire.events import ProposalFailed, ProposalReady
from pp1q.worker.daemon import serve
from pp1q.worker.proposer import ProposalSpec, propose

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

VOCAB = 32


@pytest.fixture
async def worker():
    stop = asyncio.Event()
    ports: list[int] = []
    settings = WorkerSettings(listen="127.0.0.1:0", vocab=VOCAB, draft_preset="far",
                              speculation="sampled")
    task = asyncio.create_task(serve(settings, stop, ready=lambda p, m: ports.append(p)))
    while not ports:
        await asyncio.sleep(0.01)
    yield ports[0]
    stop.set()
    await asyncio.wait_for(task, TIMEOUT_S)


def _step(prefix: Prefix, generation: int, round_id: int, seed: int = 5, top_k: int = 8
          ) -> Step:
    last_committed = prefix.last_position
    return Step(session=99, slot=0, generation=generation, round_id=round_id,
                last_committed=last_committed,
                first_position=last_committed + 1, prefix_digest=prefix.digest, depth=5,
                temperature=0.9, top_k=top_k, context_version=0, seed=seed)


# the negotiated row bound is 256 bytes (32 ids x 8, or a dense row of 32 x 4): 5 rows of
# 8 entries (320 bytes) are sent row by row, 5 rows of 4 (160 bytes) as one PROPOSAL
@pytest.mark.parametrize("top_k,frames", [(8, [Reply] * 5 + [Completion]), (4, [Proposal])],
                         ids=["row by row", "one PROPOSAL"])
async def test_rows_are_the_proposers_and_a_retry_is_refused_not_redrawn(worker, top_k, frames):
    v = await session(worker, VOCAB)
    prefix = Prefix([3, 4, 5])
    set_context(v, 0, 1, prefix)
    step = _step(prefix, 1, 1, top_k=top_k)
    v.send(step)
    ready = [e for e in await v.events_until(ProposalReady) if isinstance(e, ProposalReady)][0]
    assert [type(m) for m in FrameDecoder(v.ep.limits).feed(v.received)] == [HelloAnswer, *frames]
    # exactly the chain the proposer draws under these keys, q rows included
    drafter, _ = toy_pair(VOCAB, 0, "far")
    expect = list(propose(drafter, prefix.tokens, ProposalSpec(5, 1, 1, 3, 5, 0.9, top_k)))
    assert list(ready.draft_ids) == [t for t, _ in expect]
    assert list(ready.q_rows) == [row for _, row in expect]
    # the STEP's temperature is honoured, not silently 1 (transformers #40949)
    at_one = list(propose(drafter, prefix.tokens, ProposalSpec(5, 1, 1, 3, 5, 1.0, top_k)))
    assert [row for _, row in at_one] != [row for _, row in expect]
    # the same STEP again, bytes as sent: refused, and no REPLY drawn under the used key
    v.writer.write(encode(step))
    data = await asyncio.wait_for(v.reader.read(65536), TIMEOUT_S)
    msgs = FrameDecoder(v.ep.limits).feed(data)
    assert len(msgs) == 1 and isinstance(msgs[0], Refusal)
    assert msgs[0].reason == "duplicate_round"
    v.writer.close()


async def test_commit_advances_and_reset_drops_the_slot(worker):
    v = await session(worker, VOCAB)
    prefix = Prefix([1, 2])
    set_context(v, 0, 1, prefix)
    step = _step(prefix, 1, 1)
    v.send(step)
    ready = [e for e in await v.events_until(ProposalReady) if isinstance(e, ProposalReady)][0]
    new = list(ready.draft_ids[:2]) + [7]
    v.send(Commit(session=99, slot=0, generation=1, round_id=1, accepted=2, token=7,
                  committed=step.last_committed + 3))
    prefix.extend(new)
    v.send(_step(prefix, 1, 2))  # the worker's prefix digest matches the commit
    assert any(isinstance(e, ProposalReady) for e in await v.events_until(ProposalReady))
    # a discarded proposal: RESET drops the drafts, the committed prefix stays
    v.send(Reset(session=99, slot=0, generation=1, reason="step_timeout"))
    v.send(_step(prefix, 2, 1))  # no CONTEXT: the digest alone proves both ends agree
    assert any(isinstance(e, ProposalReady) for e in await v.events_until(ProposalReady))
    v.send(Reset(session=99, slot=0, generation=2, reason="cancelled"))
    # the request ended: a new generation without a context is refused, its state is gone
    v.send(_step(prefix, 3, 1))
    failed = [e for e in await v.events_until(ProposalFailed) if isinstance(e, ProposalFailed)]
    assert failed[0].reason.value == "no_context" and failed[0].by_peer
    v.writer.close()
