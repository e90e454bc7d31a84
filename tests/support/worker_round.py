"""One round through the worker's real adapter, in memory: a WorkerConnection (its
StepDrafter, the ZeroRows dense REPLYs are written into) with a given Proposer, driven
by the loop's own hooks and answered to a VerifierEndpoint. No socket."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from wire_helpers import HoldingTransport, feed_buffered

from pp1q.core.prefix import digest_of
from pp1q.core.q import build_row, sample
from pp1q.models.toy import ToySpec
from pp1q.runtime.metrics import Metrics
from pp1q.wire import Step, VerifierEndpoint, context_of
from pp1q.wire.decoder import FrameDecoder
from pp1q.wire.session_config import DEFAULT_MAX_SUPPORT, verifier_config, worker_config
from pp1q.wire.sessions import SessionTable
from pp1q.worker.connection import WorkerConnection
from pp1q.worker.drafting import Proposer

SESSION = 9
PREFIX = list(range(7))
ROUNDS_OF_THE_LOOP = 500  # bounded: a round takes a few dozen iterations


def step_of(slot: int, depth: int, top_k: int = 0, temperature: float = 1.0,
            generation: int = 1, prefix: list[int] = PREFIX) -> Step:
    """The STEP ``run_round`` sends for ``slot`` (its seed is the slot) after ``prefix``."""
    return Step(session=SESSION, slot=slot, generation=generation, round_id=1,
                last_committed=len(prefix) - 1, first_position=len(prefix),
                prefix_digest=digest_of(prefix), depth=depth, temperature=temperature,
                top_k=top_k, context_version=0, seed=slot)


class Canned(Proposer):
    """Rows built up front (top-``top_k`` rows of seeded logits, each token drawn from its
    own row): drafting a STEP costs microseconds, or ``row_seconds`` a row (a real
    model's pace: longer than the drafter's yield budget). ``drafted``: rows handed out."""

    def __init__(self, vocab: int, depth: int, top_k: int, row_seconds: float = 0.0) -> None:
        super().__init__(None)
        rng = np.random.default_rng(3)
        self.chain = []
        for _ in range(depth):
            row = build_row(rng.normal(size=vocab) * 2.0, top_k=top_k)
            self.chain.append((sample(row, int(rng.integers(1 << 24))), row))
        self.row_seconds, self.drafted = row_seconds, 0

    def rows(self, step, prefix):
        for token, row in self.chain[:step.depth]:
            time.sleep(self.row_seconds)
            self.drafted += 1
            yield token, row


async def until(done) -> None:
    """Turn the loop until ``done()`` (at most ROUNDS_OF_THE_LOOP turns), then once more
    for the last tick's writelines."""
    for _ in range(ROUNDS_OF_THE_LOOP):
        if done():
            break
        await asyncio.sleep(0)
    await asyncio.sleep(0)


def kinds(data: bytes) -> list[type]:
    """The message types of the frames in ``data``, in order."""
    return [type(m) for m in FrameDecoder().feed(data)]


async def connected(proposer, *, vocab: int, slots: int, depth: int, support: int = 32,
                    drains: bool = True, check_outgoing: bool = False,
                    prefixes: dict[int, list[int]] | None = None, **verifier_options
                    ) -> tuple[WorkerConnection, HoldingTransport, VerifierEndpoint]:
    """A WorkerConnection drafting with ``proposer`` on a HoldingTransport, and a
    VerifierEndpoint past HELLO that gave every slot the context PREFIX (or its own,
    ``prefixes[slot]``)."""
    spec = ToySpec(vocab=vocab)
    conn = WorkerConnection(worker_config(spec, (2,), DEFAULT_MAX_SUPPORT), SessionTable(),
                            proposer, Metrics("worker"), check_outgoing=check_outgoing)
    t = HoldingTransport(drains)
    conn.connection_made(t)
    v = VerifierEndpoint(verifier_config(spec, (2,), slots, depth, support), session=SESSION,
                         **verifier_options)
    feed_buffered(conn, v.hello())
    await asyncio.sleep(0)  # the answer leaves with the tick's writelines
    v.receive_data(t.take(), 0.0)
    for s in range(slots):
        tokens = (prefixes or {}).get(s, PREFIX)
        feed_buffered(conn, v.send(context_of(session=SESSION, slot=s, generation=1,
                                              tokens=tokens, digest=digest_of(tokens))))
    return conn, t, v


async def run_round(proposer, *, vocab: int, slots: int, depth: int, drains: bool,
                    check_outgoing: bool = False) -> tuple[list, WorkerConnection]:
    """The verifier's events for one round of ``slots`` dense STEPs, and the worker."""
    conn, t, v = await connected(proposer, vocab=vocab, slots=slots, depth=depth,
                                 drains=drains, check_outgoing=check_outgoing)
    feed_buffered(conn, b"".join(v.send(step_of(s, depth), now=0.0) for s in range(slots)))
    await until(lambda: not conn.drafter.tasks)
    return v.receive_data(t.take(), 0.0), conn
