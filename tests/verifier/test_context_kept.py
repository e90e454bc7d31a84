"""RESET keeps the committed prefix (issue 12, item 2), with the real daemons in one loop.

The worker's Proposer (the drafting seam production uses, passed to ``serve`` as a
planted worker would be) aborts every other STEP, so every other round falls back; it
also counts the prefills the worker asks of it. The verifier's connection is captured
and its CONTEXT frames decoded: after a fallback only the fallback's token crosses the
wire, never the prefix again, and the drafter fills each request's prefix once.
"""

from __future__ import annotations

import argparse
import asyncio
import functools

import pytest

from pp1q.cli import verifier as verifier_cmd
from pp1q.cli import worker as worker_cmd
from pp1q.core.errors import DistributionError, Reason
from pp1q.runtime.capture import CaptureWriter, Role, read_capture, tap
from pp1q.runtime.config import resolve
from pp1q.runtime.draw_secret import write_secret_file
from pp1q.tools.client import Client
from pp1q.tools.replay import decode
from pp1q.verifier.daemon import serve as serve_verifier
from pp1q.wire import Context, Step
from pp1q.worker.daemon import serve as serve_worker
from pp1q.worker.drafting import Proposer

pytestmark = pytest.mark.daemons  # starts real daemon servers (in this process)

VOCAB = 64
PROMPTS = [list(range(1, 41)), list(range(5, 25))]  # 40 and 20 tokens: a resend would show
MAX_TOKENS = 24
START_TIMEOUT_S = 30.0


class FlakyCountingProposer(Proposer):
    """Drafts like the daemon's Proposer but gives up on every second STEP (the worker
    then sends an ABORTED completion: a fallback on the verifier), and counts prefills."""

    prefills: list = []  # (session, slot, tokens) per whole context the worker received

    def __init__(self, model) -> None:
        super().__init__(model)
        self._steps = 0

    def prefill(self, key, prefix):
        type(self).prefills.append((*key, len(prefix)))
        return super().prefill(key, prefix)

    def rows(self, step, prefix):
        self._steps += 1
        if self._steps % 2 == 0:
            raise DistributionError(Reason.ALLOCATION_INCONSISTENT, "planted: give up")
        yield from super().rows(step, prefix)


def _settings(mod, role: str, argv: list[str]):
    p = argparse.ArgumentParser()
    mod.add_arguments(p)
    return resolve(p.parse_args(argv), role)


async def test_after_a_fallback_only_the_new_token_crosses_and_nothing_prefills_again(
        tmp_path):
    FlakyCountingProposer.prefills = []
    loop = asyncio.get_running_loop()
    cap = CaptureWriter(tmp_path / "v.pp1qcap", role=Role.VERIFIER)
    stop = asyncio.Event()
    worker_ready, verifier_ready = loop.create_future(), loop.create_future()
    w_task = loop.create_task(functools.partial(serve_worker, proposer=FlakyCountingProposer)(
        _settings(worker_cmd, "worker", ["--listen", "127.0.0.1:0", "--vocab", str(VOCAB),
                                         "--speculation", "sampled"]),
        stop, lambda port, _m: worker_ready.set_result(port)))
    port = await asyncio.wait_for(worker_ready, START_TIMEOUT_S)
    real_connect = loop.create_connection
    loop.create_connection = lambda factory, *a, **kw: real_connect(tap(factory, cap), *a, **kw)
    secret = str(tmp_path / "draw.secret")
    write_secret_file(secret)
    v_task = loop.create_task(serve_verifier(_settings(verifier_cmd, "verifier", [
        "--worker", f"127.0.0.1:{port}", "--http", "127.0.0.1:0", "--vocab", str(VOCAB),
        "--slots", "1", "--speculation", "sampled", "--draw-secret-file", secret]), stop,
        lambda http, _m: verifier_ready.set_result(http)))
    http = await asyncio.wait_for(verifier_ready, START_TIMEOUT_S)
    answers = []
    try:
        client = Client(f"http://127.0.0.1:{http}", timeout=60)
        await asyncio.to_thread(client.wait_connected, START_TIMEOUT_S)
        for i, prompt in enumerate(PROMPTS):
            answers.append(await asyncio.to_thread(client.generate, prompt, MAX_TOKENS,
                                                   seed=11 + i))
    finally:
        loop.create_connection = real_connect
        stop.set()
        await asyncio.wait_for(asyncio.gather(w_task, v_task), START_TIMEOUT_S)
        cap.close()

    header, records = read_capture(cap.path)
    msgs = [it.message for it in decode(header.role, records) if it.what == "frame"]
    contexts = [m for m in msgs if isinstance(m, Context)]
    steps = [m for m in msgs if isinstance(m, Step)]
    fallbacks = sum(sum(a["stats"]["fallbacks"].values()) for a in answers)
    assert fallbacks >= 2 and len(steps) >= 2 * len(PROMPTS)  # the planted fault fired
    # each prompt crossed once, whole; after that only appended tokens (one per fallback)
    whole = [c for c in contexts if c.start == 0]
    assert [c.count for c in whole] == [len(p) for p in PROMPTS]
    appended = [c for c in contexts if c.start > 0]
    assert all(c.count == 1 for c in appended)
    # one append per fallback whose request went on: a request that ends on its fallback
    # token has no next round to send it for (at most one such fallback per request)
    assert fallbacks - len(PROMPTS) <= len(appended) <= fallbacks
    assert sum(c.count for c in contexts) == sum(map(len, PROMPTS)) + len(appended)
    # the drafter filled each request's prefix once, never again after a fallback
    assert [n for _s, _slot, n in FlakyCountingProposer.prefills] == [len(p) for p in PROMPTS]
