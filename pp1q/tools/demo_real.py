"""``pp1q demo`` on the embedded real model: SmolLM2-135M-Instruct as the target, its
first K layers as the drafter (early exit, with the shipped exit adapter where one
ships for K), both daemons on loopback.

What it shows, in words: a few chat prompts and the text each produced, speculative
and target-only (same seed; the texts differ because the two sample with different
draws, not different distributions); accepted drafts per round; tokens/s each way;
fallbacks by cause with what each means; and the exactness check (the first token of
one context sampled many times each way, chi-square). The model is de-quantized into
a cache folder on the first run (pp1q.tools.realmodel), with progress on the terminal.
"""

from __future__ import annotations

import sys
import tempfile
import time

from pp1q.models.serving import early_exit_depth
from pp1q.runtime.settings import MAX_RANKS, VerifierSettings, default_of

# the daemons' default drafter, chosen by measurement (BENCHMARKS.md, Real model)
DEFAULT_EARLY_EXIT = early_exit_depth(default_of(VerifierSettings, "draft"))
DEPTH = 5  # the verifier's default
# with --ranks: how far one rank's forward may lag the others' before the group is lost
# (the real-model tests' bound: every rank runs the whole decoder on shared cores)
RANK_TIMEOUT_S = 120.0
REAL_DEFAULTS = {"concurrency": 3, "max_tokens": 24, "top_k": 0, "exactness_samples": 60}
PROMPTS = (
    "Write a haiku about the sea.",
    "What is the capital of France? Answer in one sentence.",
    "Give me three tips for a good night's sleep.",
)
EXACTNESS_PROMPT = "My favourite animal is the"  # short (cheap prefill), many plausible next words
FALLBACK_MEANING = {
    "watchdog_timeout": "the worker's proposal missed the verifier's STEP deadline",
    "invalid_reply": "a proposal row failed validation",
    "connection_lost": "the worker connection dropped mid-round",
    "worker_unavailable": "no worker session when the round began",
    "worker_refused": "the worker refused the STEP",
}



def _exit_words(args) -> str:
    """How the drafter exits, in words: with the shipped exit adapter or plainly."""
    from pp1q.models.embedded import smollm2_gguf
    from pp1q.models.exit_adapter import shipped_adapter
    from pp1q.models.hf import checkpoint_identity

    if args.adapter == "auto" and shipped_adapter(checkpoint_identity(smollm2_gguf()),
                                                  args.early_exit) is not None:
        return "early exit with the shipped exit adapter, an affine map fitted by " \
               "`pp1q train-adapter`"
    return "early exit, no adapter"

def sharded_args(ranks: int) -> list[str]:
    """The verifier options of a rank group serving the real model: one rank needs none;
    several hold vocabulary shards (a real model is never replicated across ranks)."""
    if ranks == 1:
        return []
    return ["--shard-vocab", "--rank-timeout-s", f"{RANK_TIMEOUT_S:g}"]


def run_real(args) -> int:
    from pp1q.runtime.launcher import start_pair
    from pp1q.tools.demo_pair import run_on_pair
    from pp1q.tools.realmodel import (
        INSTALL_HINT,
        accepted_lengths,
        default_cache,
        missing,
        model_args,
        ticking,
        warm_cache,
    )

    for key, value in REAL_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    why = missing()
    if why is not None:
        print(f"pp1q demo: {INSTALL_HINT} ({why}); `pp1q demo --model toy` needs neither",
              file=sys.stderr)
        return 2
    if not 1 <= args.ranks <= MAX_RANKS:
        print(f"pp1q demo: --ranks must be 1..{MAX_RANKS}", file=sys.stderr)
        return 2
    if not 1 <= args.early_exit <= 30:
        print("pp1q demo: --early-exit must be 1..30 (SmolLM2-135M has 30 layers)",
              file=sys.stderr)
        return 2
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests or len(PROMPTS))]
    support = "dense" if args.top_k == 0 else f"top-{args.top_k}"
    print(f"pp1q demo: SmolLM2-135M-Instruct (embedded GGUF, 30 layers, vocabulary 49152) "
          f"as the target; its first {args.early_exit} layers draft ({_exit_words(args)}); "
          f"depth {DEPTH}, {support} q, temperature {args.temperature:g}")
    if args.ranks > 1:
        print(f"verifier: {args.ranks} ranks (--shard-vocab), each holding its "
              f"1/{args.ranks} of the LM head's rows; every decision made by all of them "
              f"together, exactly")
    cache = default_cache()
    warm_cache(cache)
    log_dir = tempfile.mkdtemp(prefix="pp1q-demo-")

    def start():
        t0 = time.perf_counter()
        print("starting worker and verifier on 127.0.0.1 (each loads the model) ...",
              flush=True)
        with ticking("starting"):
            pair = start_pair(log_dir, model=model_args(args.early_exit, cache, args.adapter),
                              top_k=args.top_k, ranks=args.ranks,
                              verifier_args=sharded_args(args.ranks))
        print(f"ready in {time.perf_counter() - t0:.1f} s\n", flush=True)
        return pair

    def body(worker, verifier, url) -> None:
        spec, spec_s = _batch(url, prompts, args, True)
        hist = accepted_lengths(verifier.metrics_port)
        base, base_s = _batch(url, prompts, args, False)
        _per_prompt(prompts, spec, base)
        _summary(spec, spec_s, base, base_s, hist, worker, verifier, url, args)
        tokenizer = _tokenizer(cache)

        def name(token: int) -> str:
            return repr(tokenizer.decode([token]))

        h = _exactness(url, args, name) if args.exactness_samples > 0 else None
        if args.plot:
            from pp1q.tools.plot import write_plot

            write_plot(args.plot, title=f"pp1q demo: SmolLM2-135M, early exit "
                       f"{args.early_exit}/30 drafting, T = {args.temperature:g}",
                       exactness=h, labels=("speculative", "target-only"),
                       accepted_hist=hist, depth=DEPTH, name=name)
            print(f"\nplot written to {args.plot}")

    return run_on_pair(
        log_dir, start, body, args.keep,
        lambda url: f"curl -s {url}/v1/chat/completions -d '{{\"messages\": [{{\"role\": "
                    f"\"user\", \"content\": \"Hello\"}}], \"max_tokens\": 24}}'")


def _options(args, speculative: bool) -> dict:
    return {"speculative": speculative, "chat": True, "temperature": args.temperature,
            "draft_temperature": args.temperature,
            "top_k": None if args.top_k == 0 else args.top_k}


def _batch(url: str, prompts, args, speculative: bool):
    from pp1q.tools.client import run_batch

    label = "speculative" if speculative else "target-only"
    done = [0, 0]

    def progress(answer: dict, elapsed: float) -> None:
        done[0] += 1
        done[1] += len(answer["token_ids"])
        print(f"  {label}: {done[0]}/{len(prompts)} answers, {done[1]} tokens, "
              f"{elapsed:.1f} s", flush=True)

    return run_batch(url, prompts, args.max_tokens, concurrency=args.concurrency,
                     first_seed=args.seed, options=_options(args, speculative),
                     on_answer=progress)


def _one_line(text: str, width: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _per_prompt(prompts, spec, base) -> None:
    for i, (prompt, a, b) in enumerate(zip(prompts, spec, base, strict=True), start=1):
        s = a["stats"]
        print(f"\nprompt {i}: {prompt}")
        print(f"  speculative: {_one_line(a['text'])}")
        print(f"  target-only: {_one_line(b['text'])}")
        print(f"  {len(a['token_ids'])} tokens ({a['finish_reason']}) in {s['rounds']} rounds: "
              f"{s['accepted']} of {s['drafted']} drafts accepted, "
              f"{s['accepted'] / max(s['rounds'], 1):.2f} per round; "
              f"{s['target_only_steps']} target-only steps")


def _summary(spec, spec_s, base, base_s, hist, worker, verifier, url, args) -> None:
    from pp1q.tools.demo_pair import batch_totals

    tokens, rounds, accepted, drafted = batch_totals(spec)
    base_tokens = batch_totals(base)[0]
    rate, base_rate = tokens / spec_s, base_tokens / base_s
    print("\nsummary")
    print(f"  speculative  {tokens:5d} tokens in {spec_s:6.1f} s = {rate:6.2f} tokens/s")
    print(f"  target-only  {base_tokens:5d} tokens in {base_s:6.1f} s = {base_rate:6.2f} "
          f"tokens/s   (speculative / target-only = {rate / base_rate:.2f})")
    print(f"  accepted drafts per round: {accepted / max(rounds, 1):.2f} ({accepted} of "
          f"{drafted} drafts over {rounds} rounds); rounds by accepted drafts "
          f"0..{DEPTH}: {hist[:DEPTH + 1]}")
    print("  on one machine the worker's drafting forwards share the CPU with the target's:"
          " `pp1q bench model` measures the verifier's own seconds per token with the "
          "two daemons on separate cores (BENCHMARKS.md, Real model)")
    falls: dict[str, int] = {}
    for a in spec:
        for cause, n in a["stats"]["fallbacks"].items():
            if n:
                falls[cause] = falls.get(cause, 0) + n
    if not falls:
        print("  fallbacks: none (every round verified a whole proposal)")
    for cause, n in falls.items():
        print(f"  fallback {cause} x{n}: {FALLBACK_MEANING.get(cause, cause)}; the round "
              f"took one target-only step instead (exact either way)")
    print(f"  metrics were served at http://127.0.0.1:{worker.metrics_port}/metrics (worker),"
          f" http://127.0.0.1:{verifier.metrics_port}/metrics (verifier)")
    print(f"  API: POST {url}/v1/chat/completions, /v1/completions (OpenAI), /v1/generate "
          f"(--keep leaves the daemons running)")


def _exactness(url: str, args, name):
    """The first token after one context, N requests each way, side by side, and the
    chi-square test that both come from one distribution."""
    from pp1q.tools.client import run_batch
    from pp1q.tools.demo_pair import report_exactness

    n = args.exactness_samples
    print(f"\nexactness: the first token after {EXACTNESS_PROMPT!r}, {n} requests each way "
          f"...", flush=True)
    samples = []
    for speculative in (True, False):
        options = {**_options(args, speculative), "chat": False}
        answers, _ = run_batch(url, [EXACTNESS_PROMPT] * n, 1, concurrency=args.concurrency,
                               first_seed=args.seed + 1_000_000, options=options)
        samples.append([a["token_ids"][0] for a in answers])
    return report_exactness(samples, name)


def _tokenizer(cache):
    """The target's tokenizer from the cached copy (token labels for bars and plot)."""
    from transformers import AutoTokenizer

    from pp1q.models.embedded import smollm2_gguf
    from pp1q.models.hf import gguf_cache_entry

    return AutoTokenizer.from_pretrained(gguf_cache_entry(smollm2_gguf(), cache),
                                         local_files_only=True)
