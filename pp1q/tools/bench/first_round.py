"""``pp1q bench first-round``: a long prompt's answer on the real pair, speculative beside
target-only, each daemon on a core of its own.

A speculative request's prompt reaches the worker before the verifier's target prefills
it (pp1q.verifier.scheduler, ``_context_ahead``), so the drafter's prefill runs beside
the target's and the first round waits for the longer of the two, not their sum
(before, the worker began only at the first STEP: a 4,096-token prompt's first round
then held the drafter's whole prefill against the 20 s STEP watchdog). This suite
starts the worker and the verifier on the embedded SmolLM2-135M (early exit, as
``pp1q demo``), and per prompt length answers the same prompt target-only (the physical
limit: the verifier's own prefill and steps, nothing of the worker) and speculative,
alternated, ``ANSWER_TOKENS`` tokens each. The ratio speculative / target-only is what
the worker adds (its prefill's remainder, the rounds' drafting) on top of what the
verifier does anyway; with the prefills one after the other it held the drafter's
whole prefill. Fallbacks are the speculative answers' own (a watchdog fallback is a
first round that waited out the deadline).
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Iterator

TITLE = "first round: a long prompt's answer on the real pair, speculative vs target-only"
PROMPT_TOKENS, QUICK_PROMPT_TOKENS = (1024, 2048, 4096), (1024,)
ANSWER_TOKENS = 8  # a few rounds: the prompt's prefill is most of the answer
REPEATS, QUICK_REPEATS = 2, 1  # each order alternated: target-only first, then speculative
REQUEST_TIMEOUT_S = 600.0  # a 4,096-token prompt is ~25-60 s a request on a 2-core CPU


def _answer(client, prompt: list[int], speculative: bool) -> tuple[float, dict]:
    t0 = time.perf_counter()
    answer = client.generate(prompt, ANSWER_TOKENS, seed=3, temperature=0.8,
                             speculative=speculative)
    return time.perf_counter() - t0, answer["stats"]


def run(quick: bool = False) -> Iterator[str]:
    from pp1q.tools.realmodel import bench_skip

    skipped = bench_skip()
    if skipped is not None:
        yield skipped
        return
    from pp1q.runtime.launcher import start_pair
    from pp1q.tools.client import Client
    from pp1q.tools.demo_real import DEFAULT_EARLY_EXIT
    from pp1q.tools.realmodel import default_cache, model_args, warm_cache

    cache = default_cache()
    warm_cache(cache, say=lambda _line: None)
    cores = ("0", "1") if (os.cpu_count() or 1) >= 2 else None
    log_dir = tempfile.mkdtemp(prefix="pp1q-bench-first-round-")
    worker, verifier, url = start_pair(log_dir, model=model_args(DEFAULT_EARLY_EXIT, cache),
                                       top_k=32, cores=cores)
    try:
        client = Client(url, timeout=REQUEST_TIMEOUT_S)
        client.generate([1, 2, 3, 4], 4, seed=1)  # both models warm
        where = "worker on core 0, verifier on core 1" if cores else "one core for both"
        yield (f"SmolLM2-135M, early exit at {DEFAULT_EARLY_EXIT}, {where}; "
               f"{ANSWER_TOKENS} tokens an answer, temperature 0.8; seconds a request")
        yield "| prompt ids | target-only | speculative | speculative / target-only | fallbacks |"
        yield "|---:|---:|---:|---:|---|"
        rng = random.Random(7)
        for n in QUICK_PROMPT_TOKENS if quick else PROMPT_TOKENS:
            prompt = [rng.randrange(100, 40000) for _ in range(n)]
            alone, spec, fallbacks = [], [], {}
            for _ in range(QUICK_REPEATS if quick else REPEATS):
                alone.append(_answer(client, prompt, False)[0])
                seconds, stats = _answer(client, prompt, True)
                spec.append(seconds)
                for cause, count in stats["fallbacks"].items():
                    if count:
                        fallbacks[cause] = fallbacks.get(cause, 0) + count
            a, s = min(alone), min(spec)
            said = ", ".join(f"{k} {v}" for k, v in sorted(fallbacks.items())) or "none"
            yield f"| {n} | {a:.2f} | {s:.2f} | {s / a:.2f}x | {said} |"
    finally:
        verifier.stop()
        worker.stop()
    yield f"(daemon logs in {log_dir})"
