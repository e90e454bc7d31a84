"""``pp1q demo``: a worker and a verifier on loopback, a batch of requests, a summary.

The default serves the embedded SmolLM2-135M (pp1q.tools.demo_real); ``--model toy``
runs the seeded toy pair at vocabulary 129280 (below, unchanged)."""

from __future__ import annotations

import sys
import tempfile

HELP = "start a worker and a verifier on loopback, run a batch of requests, print a summary"



def add_arguments(p) -> None:
    from pp1q.models.toy import DRAFT_PRESETS
    from pp1q.tools.demo_real import DEFAULT_EARLY_EXIT

    p.add_argument("--model", choices=("embedded", "toy"), default="embedded",
                   help="embedded: SmolLM2-135M drafting with its first K layers (default; "
                        "needs scripts/install.sh); toy: the seeded toy pair")
    p.add_argument("--early-exit", type=int, default=DEFAULT_EARLY_EXIT, metavar="K",
                   help=f"embedded: the drafter is the first K of 30 layers "
                        f"({DEFAULT_EARLY_EXIT}; see BENCHMARKS.md, Real model)")
    p.add_argument("--adapter", choices=("auto", "none"), default="auto",
                   help="embedded: auto runs the shipped exit adapter for K when there is "
                        "one (K = 24, 28); none: the plain early exit")
    p.add_argument("--temperature", type=float, default=0.7,
                   help="embedded: target and draft temperature (0.7)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw the exactness check and the accepted lengths "
                        "(needs matplotlib: pip install 'pp1q[plot]')")
    p.add_argument("--vocab", type=int, default=129280, help="toy vocabulary (default 129280)")
    p.add_argument("--model-seed", type=int, default=0)
    p.add_argument("--draft-preset", default="close", choices=sorted(DRAFT_PRESETS),
                   help="toy drafter's distance from the target (default close)")
    p.add_argument("--requests", type=int, default=None,
                   help="requests in the batch (toy 16; embedded: its 3 prompts)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="requests in flight (toy 4 slots; embedded 3)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="tokens per request (toy 48; embedded 24)")
    p.add_argument("--top-k", type=int, default=None,
                   help="proposal support, 0 = dense (toy 32; embedded dense)")
    p.add_argument("--target-delay-ms", type=float, default=50.0,
                   help="simulated forward-pass latency of the toy target (50 ms; 0 = raw toy)")
    p.add_argument("--seed", type=int, default=1, help="first request seed (1)")
    p.add_argument("--ranks", type=int, default=1,
                   help="verifier ranks (torch.distributed: gloo unless a GPU per rank is visible; "
                        "default 1); embedded: "
                        "each rank holds a vocabulary shard of the LM head (--shard-vocab)")
    p.add_argument("--exactness-samples", type=int, default=None, metavar="N",
                   help="first tokens of one context sampled each way for the exactness "
                        "check (toy 400, embedded 60; 0 skips it)")
    p.add_argument("--keep", action="store_true",
                   help="leave both daemons running after the summary until Ctrl-C")


def _batch(url: str, prompts, args, speculative: bool, label: str):
    from pp1q.tools.client import run_batch

    done = [0, 0]  # requests, tokens
    tty = sys.stdout.isatty()

    def progress(answer: dict, elapsed: float) -> None:
        done[0] += 1
        done[1] += len(answer["token_ids"])
        _progress(label, done, len(prompts), elapsed, tty)

    top_k = args.top_k if 0 < args.top_k < args.vocab else None  # k >= vocab: dense
    options = {"speculative": speculative, "top_k": top_k}
    out = run_batch(url, prompts, args.max_tokens, concurrency=args.concurrency,
                    first_seed=args.seed, options=options, on_answer=progress)
    if tty:
        print()
    return out


def _progress(label: str, done, total: int, elapsed: float, tty: bool) -> None:
    width = 24
    filled = width * done[0] // total
    line = (f"{label:>12} [{'#' * filled}{'.' * (width - filled)}] {done[0]:3d}/{total} "
            f"requests, {done[1]:5d} tokens, {done[1] / max(elapsed, 1e-9):7.1f} tokens/s")
    if tty:
        print("\r" + line, end="", flush=True)
    elif done[0] == total or done[0] % max(1, total // 4) == 0:
        print(line, flush=True)


TOY_DEFAULTS = {"requests": 16, "concurrency": 4, "max_tokens": 48, "top_k": 32,
                "exactness_samples": 400}


def _defaults(args, table: dict) -> None:
    for key, value in table.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def run(args) -> int:
    if args.plot:
        from pp1q.runtime.files import check_output
        from pp1q.tools.plot import require_matplotlib

        try:
            require_matplotlib()  # before anything starts: the answer is one line
            check_output(args.plot)  # a FIFO, folder or device: refused now, not at the end
        except ImportError as e:
            print(f"pp1q demo: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"pp1q demo: --plot {args.plot}: {e.strerror}", file=sys.stderr)
            return 2
    if args.model == "embedded":
        from pp1q.tools.demo_real import run_real

        return run_real(args)
    _defaults(args, TOY_DEFAULTS)
    return _run_toy(args)


def _run_toy(args) -> int:
    from pp1q.runtime.launcher import demo_prompts, start_pair
    from pp1q.tools.demo_pair import run_on_pair
    from pp1q.tools.realmodel import accepted_lengths

    log_dir = tempfile.mkdtemp(prefix="pp1q-demo-")
    print(f"pp1q demo: toy DSpark-like drafter ({args.draft_preset}) and toy target, vocabulary "
          f"{args.vocab}, depth 5, {'dense' if args.top_k == 0 else f'top-{args.top_k}'} q, "
          f"target forward {args.target_delay_ms:g} ms (simulated)")
    print("starting worker and verifier on 127.0.0.1 ...", flush=True)

    def start():
        return start_pair(
            log_dir, vocab=args.vocab, model_seed=args.model_seed, preset=args.draft_preset,
            top_k=args.top_k, target_delay_ms=args.target_delay_ms, ranks=args.ranks)

    def body(worker, verifier, url) -> None:
        prompts = demo_prompts(args.requests, args.vocab, args.seed)
        spec, spec_s = _batch(url, prompts, args, True, "speculative")
        hist = accepted_lengths(verifier.metrics_port) if args.plot else None
        base, base_s = _batch(url, prompts, args, False, "target-only")
        _summary(args, spec, spec_s, base, base_s, prompts, worker, verifier, url)
        h = _exactness(url, prompts[0], args) if args.exactness_samples > 0 else None
        if args.plot:
            from pp1q.tools.plot import write_plot

            write_plot(args.plot, title=f"pp1q demo: toy pair ({args.draft_preset}), "
                       f"vocabulary {args.vocab}", exactness=h,
                       labels=("speculative", "target-only"), accepted_hist=hist, depth=5)
            print(f"\nplot written to {args.plot}")

    return run_on_pair(log_dir, start, body, args.keep,
                       lambda url: f"pp1q generate --url {url} --prompt 1,2,3 --max-tokens 16")


def _summary(args, spec, spec_s, base, base_s, prompts, worker, verifier, url) -> None:
    from pp1q.models.toy import toy_pair
    from pp1q.tools.demo_pair import batch_totals
    from pp1q.tools.exactness import Z95, agreement, ratio_interval
    from pp1q.tools.theory import expected_accepted

    tokens, rounds, accepted, drafted = batch_totals(spec)
    base_tokens = batch_totals(base)[0]
    fallbacks: dict[str, int] = {}
    for a in spec:
        for cause, n in a["stats"]["fallbacks"].items():
            fallbacks[cause] = fallbacks.get(cause, 0) + n
    print("computing the theoretical expectation for these models ...", flush=True)
    drafter, target = toy_pair(args.vocab, args.model_seed, args.draft_preset)
    # contexts like the batch's: its prompts, about as many rounds as a request runs
    mean, err = expected_accepted(drafter, target, prompts[:8],
                                  rounds_per_prompt=max(4, args.max_tokens // 3),
                                  top_k=None if not 0 < args.top_k < args.vocab else args.top_k)
    rate, base_rate = tokens / spec_s, base_tokens / base_s
    print("\nsummary")
    print(f"  speculative  {tokens:6d} tokens in {spec_s:6.2f} s = {rate:8.1f} tokens/s")
    print(f"  target-only  {base_tokens:6d} tokens in {base_s:6.2f} s = {base_rate:8.1f} tokens/s"
          f"   (speed-up x{rate / base_rate:.2f})")
    measured, se = ratio_interval([a["stats"]["accepted"] for a in spec],
                                  [a["stats"]["rounds"] for a in spec])
    diff, half, ok = agreement(measured, se, mean, err)
    print(f"  accepted drafts per round: measured {measured:.2f} +- {Z95 * se:.2f} "
          f"({accepted}/{drafted} over {rounds} rounds of {len(spec)} requests), expected "
          f"{mean:.2f} +- {Z95 * err:.2f} for these models (95% intervals)")
    print(f"  measured - expected = {diff:+.2f} +- {half:.2f} (both noises): "
          + ("consistent" if ok else "outside the interval (1 run in 20 is, by chance)"))
    print("  fallbacks by cause: "
          + (", ".join(f"{k}={v}" for k, v in fallbacks.items() if v) or "none"))
    where = "served" if args.keep else "were served (until the demo ended; --keep leaves them)"
    print(f"  metrics {where} at http://127.0.0.1:{worker.metrics_port}/metrics (worker), "
          f"http://127.0.0.1:{verifier.metrics_port}/metrics (verifier)")
    print(f"  API: POST {url}/v1/completions and /v1/chat/completions (OpenAI), "
          f"POST {url}/v1/generate, GET {url}/healthz")


def _exactness(url: str, prompt: list[int], args):
    """The claim itself, for one context: the first token of N speculative requests and
    of N target-only requests, side by side, and a chi-square test that they share one
    distribution (each speculative first token passed the ratio test or is a residual
    draw: exact sampling says its law is the target's p)."""
    from pp1q.tools.client import run_batch
    from pp1q.tools.demo_pair import report_exactness

    n = args.exactness_samples
    top_k = args.top_k if 0 < args.top_k < args.vocab else None
    print(f"\nexactness: the first token after one context, {n} requests each way ...",
          flush=True)
    samples = []
    for speculative in (True, False):
        answers, _ = run_batch(url, [prompt] * n, 1, concurrency=args.concurrency,
                               first_seed=args.seed + 1_000_000,
                               options={"speculative": speculative, "top_k": top_k})
        samples.append([a["token_ids"][0] for a in answers])
    return report_exactness(samples)
