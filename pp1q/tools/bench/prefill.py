"""``pp1q bench prefill``: the verifier's chunked prefill on the real model, side by side
with the whole-prompt prefill it replaced.

EngineDecider prefills a prompt in chunks of ``prefill_chunk`` ids, each a call of its
own on the one engine thread (pp1q.verifier.engine_decider). This suite runs the
embedded SmolLM2-135M through EngineDecider and, per chunk size (the whole prompt as
one chunk is the old behaviour), measures in one run:

  prefill    seconds to open a long prompt, alone (what chunking costs: more, smaller
             forwards, the cache grown chunk by chunk)
  neighbour  a short request stepping target-only for as long as the long prompt is
             prefilled again: how many steps it made meanwhile, and its longest wait
  cancelled  the long prompt prefilled once more, its client leaving
             ``NEIGHBOUR_AFTER_S`` in (its task cancelled, as the HTTP server does):
             seconds until the short request's next step is answered, i.e. until the
             engine has stopped on the long prompt

Threads are torch's default (the daemon's); the model runs on CUDA where there is a
GPU, else on the CPU. Figures are seconds of one run each (the prefill's is long enough
that one run tells; its CPU seconds too, which a shared machine inflates less than its
wall clock).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from pp1q.tools.bench import bench_device

TITLE = "prefill: a long prompt in chunks, and the requests beside it (real model)"
PROMPT_TOKENS, QUICK_PROMPT_TOKENS = 4096, 1024
CHUNKS = (0, 1024, 256, 128)  # 0: the whole prompt in one call (before chunking)
NEIGHBOUR_AFTER_S = 0.5  # the long request's client leaves this long into its prefill
SHORT_PROMPT = 16


def _jobs(n: int, vocab: int):
    import numpy as np

    from pp1q.verifier.api import GenerateRequest
    from pp1q.verifier.job import Job

    ids = [int(x) for x in np.random.default_rng(0).integers(10, vocab, n)]

    def job(prompt: list[int], slot: int) -> Job:
        return Job(GenerateRequest(prompt=prompt, max_tokens=4, seed=slot + 1,
                                   speculative=False, greedy=False, draft_temperature=1.0,
                                   top_k=None), slot)
    return job(ids, 0), job(ids[:SHORT_PROMPT], 1)


async def _one(target, chunk: int, n: int) -> tuple[float, float, int, float, float]:
    """(prefill alone: wall and CPU seconds; the neighbour's steps during the long
    prefill and its longest wait; its wait after the long request's cancel)."""
    from pp1q.core.drawkey import DrawKeys
    from pp1q.verifier.engine_decider import EngineDecider

    decider = EngineDecider(target, slots=2, depth=5, draws=DrawKeys(b"\x01" * 32),
                            prefill_chunk=chunk or n)
    long, short = _jobs(n, target.vocab)
    t0, c0 = time.perf_counter(), time.process_time()
    await decider.open(long)
    prefill, cpu = time.perf_counter() - t0, time.process_time() - c0
    decider.close(long)
    await decider.open(short)
    steps, longest = 0, 0.0
    opening = asyncio.ensure_future(decider.open(long))
    while not opening.done():  # the neighbour steps for as long as the prefill runs
        t0 = time.perf_counter()
        await decider.decide_target_only(short, 0, steps)
        steps, longest = steps + 1, max(longest, time.perf_counter() - t0)
    decider.close(long)
    opening = asyncio.ensure_future(decider.open(long))
    await asyncio.sleep(NEIGHBOUR_AFTER_S)
    opening.cancel()  # the long request's client leaves, as the HTTP server cancels it
    t0 = time.perf_counter()
    await decider.decide_target_only(short, 0, steps)
    cancelled = time.perf_counter() - t0
    await asyncio.gather(opening, return_exceptions=True)
    decider.close(long)
    decider.close(short)
    return prefill, cpu, steps, longest, cancelled


def run(quick: bool = False) -> Iterator[str]:
    from pp1q.tools.realmodel import bench_skip, load_embedded

    skipped = bench_skip()
    if skipped is not None:
        yield skipped
        return
    from pp1q.models.hf_target import HFTarget

    n = QUICK_PROMPT_TOKENS if quick else PROMPT_TOKENS
    device = bench_device()
    target = HFTarget.from_checkpoint(load_embedded(device))
    yield (f"SmolLM2-135M on {device}; a {n}-token prompt; its client leaves "
           f"{NEIGHBOUR_AFTER_S} s in; seconds, one run each")
    yield ("| chunk | prefill alone | CPU s | / whole (CPU) | neighbour's steps meanwhile "
           "| its longest wait | its wait, long one cancelled |")
    yield "|---|---:|---:|---:|---:|---:|---:|"
    whole = None
    for chunk in CHUNKS:
        prefill, cpu, steps, longest, cancelled = asyncio.run(_one(target, chunk, n))
        whole = whole or cpu
        yield (f"| {chunk or 'whole'} | {prefill:.2f} | {cpu:.2f} | {cpu / whole:.2f}x "
               f"| {steps} | {longest:.2f} | {cancelled:.2f} |")
