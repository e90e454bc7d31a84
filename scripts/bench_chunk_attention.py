"""The chunked prefill's CPU seconds with transformers' sdpa attention and with
pp1q.models.hf_attention's split, alternated (BENCHMARKS.md, "Chunked prefill").

    python3 scripts/bench_chunk_attention.py [THREADS [IDS [CHUNK [RUNS]]]]

Defaults: 1 thread, a 4,096-id prompt, 128-id chunks, 4 runs of each (the order
alternating): HFTarget.open then extend per chunk, as the verifier's EngineDecider does,
on the embedded SmolLM2-135M (de-quantized into ~/.cache/pp1q on first use).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from pp1q.models import hf_attention
from pp1q.models.embedded import smollm2_gguf
from pp1q.models.hf import load_checkpoint
from pp1q.models.hf_target import HFTarget


def main(threads: int = 1, n: int = 4096, chunk: int = 128, runs: int = 4) -> None:
    torch.set_num_threads(threads)
    ckpt = load_checkpoint(smollm2_gguf(), gguf_cache=Path.home() / ".cache" / "pp1q")
    target = HFTarget.from_checkpoint(ckpt)
    ids = torch.randint(10, ckpt.vocab, (n,), generator=torch.Generator().manual_seed(0))
    ids = [int(x) for x in ids]
    seconds: dict[str, list[float]] = {}
    last: dict[str, torch.Tensor] = {}
    for r in range(runs):
        impls = ("sdpa", hf_attention.register())
        for impl in impls if r % 2 == 0 else impls[::-1]:
            ckpt.model.set_attn_implementation(impl)
            c0 = time.process_time()
            target.open(0, ids[:chunk])
            for i in range(chunk, n, chunk):
                target.extend(0, ids[i:i + chunk])
            seconds.setdefault(impl, []).append(time.process_time() - c0)
            last[impl] = target.score([(0, [])])[0]
            target.close(0)
            print(f"run {r} {impl:16s} {seconds[impl][-1]:6.2f} CPU s", flush=True)
    a, b = last.values()
    print(f"max |logits difference| after the prefill: {float((a - b).abs().max()):.1e}")
    for impl, s in seconds.items():
        each = " / ".join(f"{x:.2f}" for x in s)
        print(f"{impl:16s} mean {sum(s) / len(s):6.2f} CPU s  ({each})")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
