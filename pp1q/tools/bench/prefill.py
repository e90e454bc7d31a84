"""``pp1q bench prefill``: the verifier's chunked prefill on the real model, side by side
with the whole-prompt prefill it replaced.

EngineDecider prefills a prompt in chunks of ``prefill_chunk`` ids, each a call of its
own on the one engine thread (pp1q.verifier.engine_decider). This suite runs the
embedded SmolLM2-135M through EngineDecider and, per chunk size (the whole prompt as
one chunk is the old behaviour), measures in one run:

  prefill    seconds to open a long prompt, alone (what chunking costs: more, smaller
             forwards, the cache grown chunk by chunk)
  neighbour  a short request's target-only step, asked for while the long prompt is
             being prefilled (``NEIGHBOUR_AFTER_S`` in): seconds until it is answered
  cancelled  the same, when the long request's client leaves as the short one asks
             (its task cancelled, as the HTTP server does): seconds until the short
             request is answered, i.e. until the engine has stopped on the long prompt

Threads are torch's default (the daemon's); the model runs on CUDA where there is a
GPU, else on the CPU. Figures are wall-clock seconds of one run each (the prefill's is
long enough that one run tells; this machine is shared, so compare within a run).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from pp1q.tools.bench import bench_device

TITLE = "prefill: a long prompt in chunks, and the requests beside it (real model)"
PROMPT_TOKENS, QUICK_PROMPT_TOKENS = 4096, 1024
CHUNKS = (0, 1024, 256, 128)  # 0: the whole prompt in one call (before chunking)
NEIGHBOUR_AFTER_S = 0.5  # the short request arrives this long into the long prefill
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


async def _one(target, chunk: int, n: int) -> tuple[float, float, float]:
    """(prefill alone, the neighbour's wait, its wait after a cancel) in seconds."""
    from pp1q.core.drawkey import DrawKeys
    from pp1q.verifier.engine_decider import EngineDecider

    decider = EngineDecider(target, slots=2, depth=5, draws=DrawKeys(b"\x01" * 32),
                            prefill_chunk=chunk or n)
    long, short = _jobs(n, target.vocab)
    t0 = time.perf_counter()
    await decider.open(long)
    prefill = time.perf_counter() - t0
    decider.close(long)
    await decider.open(short)
    waits = []
    for leaves in (False, True):
        opening = asyncio.ensure_future(decider.open(long))
        await asyncio.sleep(NEIGHBOUR_AFTER_S)
        if leaves:
            opening.cancel()
        t0 = time.perf_counter()
        await decider.decide_target_only(short, 0, len(waits))
        waits.append(time.perf_counter() - t0)
        await asyncio.gather(opening, return_exceptions=True)
        decider.close(long)
    decider.close(short)
    return prefill, *waits


def run(quick: bool = False) -> Iterator[str]:
    from pp1q.tools.realmodel import default_cache, missing, quiet_progress_bars

    why = missing()
    if why is not None:
        yield f"skipped: {why}; the real model needs `bash scripts/install.sh`"
        return
    from pp1q.models.embedded import smollm2_gguf
    from pp1q.models.hf import load_checkpoint
    from pp1q.models.hf_target import HFTarget

    quiet_progress_bars()
    n = QUICK_PROMPT_TOKENS if quick else PROMPT_TOKENS
    device = bench_device()
    ckpt = load_checkpoint(smollm2_gguf(), device=device, gguf_cache=default_cache())
    target = HFTarget.from_checkpoint(ckpt)
    yield (f"SmolLM2-135M on {device}; a {n}-token prompt; the neighbour asks "
           f"{NEIGHBOUR_AFTER_S} s into its prefill; seconds, one run each")
    yield "| chunk | prefill alone | / whole | neighbour's wait | its wait, long one cancelled |"
    yield "|---|---:|---:|---:|---:|"
    whole = None
    for chunk in CHUNKS:
        prefill, neighbour, cancelled = asyncio.run(_one(target, chunk, n))
        whole = whole or prefill
        yield (f"| {chunk or 'whole'} | {prefill:.2f} | {prefill / whole:.2f}x "
               f"| {neighbour:.2f} | {cancelled:.2f} |")
