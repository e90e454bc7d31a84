"""K/V appended in place (pp1q.models.hf_cache) against transformers' DynamicCache, and
the chunk size's price, alternated in one sitting (BENCHMARKS.md, "Chunked prefill").

    python3 scripts/bench_kv_append.py [IDS [RUNS [MODES]]]

MODES: comma-separated THREADS:CHUNK:CACHE (CHUNK 0: the whole prompt in one call;
CACHE ``grow`` or ``dyn``); default
``1:0:grow,1:128:grow,1:128:dyn,2:0:grow,2:128:grow,2:128:dyn,2:256:grow``. Each mode:
HFTarget.open then extend per chunk, as the verifier's EngineDecider does, then one
target-only row; wall and CPU seconds and that row's largest difference from the first
whole-prompt mode's. Then 20 rounds of 3 drafts (each committed with none accepted) on
the prompt's cache, growing against DynamicCache, 1 and 2 threads: CPU seconds. The
embedded SmolLM2-135M, de-quantized into ~/.cache/pp1q on first use; IDS 4,096, RUNS 3.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch

from pp1q.models import hf_cache
from pp1q.models.embedded import smollm2_gguf
from pp1q.models.hf import load_checkpoint
from pp1q.models.hf_cache import kv_tensors
from pp1q.models.hf_target import HFTarget

MODES = "1:0:grow,1:128:grow,1:128:dyn,2:0:grow,2:128:grow,2:128:dyn,2:256:grow"
GROWING = hf_cache.make_growing


def _prefill(target: HFTarget, ids: list[int], mode: str) -> tuple[float, float, torch.Tensor]:
    threads, chunk, cache = mode.split(":")
    torch.set_num_threads(int(threads))
    chunk = int(chunk) or len(ids)
    hf_cache.make_growing = GROWING if cache == "grow" else (lambda c: c)
    try:
        w0, c0 = time.perf_counter(), time.process_time()
        target.open(0, ids[:chunk])
        for i in range(chunk, len(ids), chunk):
            target.extend(0, ids[i:i + chunk])
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        return wall, cpu, target.score([(0, [])])[0][-1]
    finally:
        target.close(0)
        hf_cache.make_growing = GROWING


def _rounds(target: HFTarget, ids: list[int], runs: int, rounds: int = 20) -> None:
    from transformers import DynamicCache

    target.open("grow", ids)
    ledger, grown = target._requests["grow"]
    plain = DynamicCache(config=target.lm.model.config)
    with torch.inference_mode():
        for i, (k, v) in enumerate(kv_tensors(grown)):
            plain.update(k.clone(), v.clone(), i)
    target._requests["dyn"] = (copy.deepcopy(ledger), plain)
    for r in range(runs):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for key in ("dyn", "grow") if r % 2 == 0 else ("grow", "dyn"):
                c0 = time.process_time()
                for _ in range(rounds):
                    target.score([(key, [11, 12, 13])])
                    target.commit(key, 0, 14)
                print(f"run {r} {threads} thread(s) {key:4s} {rounds} rounds on "
                      f"~{len(ids)} ids: {time.process_time() - c0:6.2f} CPU s", flush=True)


def main(n: int = 4096, runs: int = 3, modes: str = MODES) -> None:
    ckpt = load_checkpoint(smollm2_gguf(), gguf_cache=Path.home() / ".cache" / "pp1q")
    target = HFTarget.from_checkpoint(ckpt)
    ids = torch.randint(10, ckpt.vocab, (n,), generator=torch.Generator().manual_seed(0))
    ids = [int(x) for x in ids]
    first = None
    for r in range(runs):
        for mode in modes.split(","):
            wall, cpu, row = _prefill(target, ids, mode)
            first = row if first is None else first
            print(f"run {r} {mode:12s} wall {wall:6.2f} s  CPU {cpu:6.2f} s  "
                  f"row vs the first {float((row - first).abs().max()):.1e}", flush=True)
    _rounds(target, ids, runs)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]), *sys.argv[3:4])
