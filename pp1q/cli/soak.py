"""``pp1q soak``: real daemons, four concurrent requests, random faults, a summary; on
the toy pair (default) or the embedded real model (``--model embedded``)."""

from __future__ import annotations

import signal
import sys
import tempfile

HELP = "run concurrent requests against real daemons with random faults; report and check"


def add_arguments(p) -> None:
    p.add_argument("--model", choices=("toy", "embedded"), default="toy",
                   help="what the daemons serve: the toy pair (default) or the shipped "
                        "SmolLM2-135M, drafting with its first layers and the exit adapter "
                        "(the real-model defaults: pp1q.tools.chaos.real_soak)")
    p.add_argument("--minutes", type=float, default=None, help="how long to run (minutes)")
    p.add_argument("--seconds", type=float, default=None,
                   help="how long to run (seconds; overrides --minutes; default 60)")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight (4)")
    p.add_argument("--vocab", type=int, default=None,
                   help="toy vocabulary (1024; 16 with --streamed-sparse)")
    p.add_argument("--streamed-sparse", action="store_true",
                   help="vocabulary 16 and requests of top 3, 4 or 8: top-4 and top-8 steps "
                        "are too large for one PROPOSAL and stream sparse REPLY rows "
                        "(default: dense, top 8, top 32 at vocabulary 1024, every sparse "
                        "step one PROPOSAL)")
    p.add_argument("--watchdog-ms", type=int, default=None,
                   help="verifier STEP watchdog (300; the real model: 20000, the daemons' "
                        "own default for it)")
    p.add_argument("--target-delay-ms", type=float, default=None,
                   help="toy: simulated target forward pass (40 ms; keeps the soak near "
                        "one core)")
    p.add_argument("--crash-every-s", type=float, default=None,
                   help="kill and restart the worker this often (300 s; the real model's first "
                        "kill waits for its warm-up; 0 = never)")
    p.add_argument("--abandon-p", type=float, default=None,
                   help="per request: its client leaves at a random moment, before the "
                        "answer or mid-stream (0.02; the real model 0.05; 0 = every "
                        "request read to its end)")
    p.add_argument("--hang-s", type=float, default=None,
                   help="a request this long has hung (30 s; the real model 240 s; each "
                        "client's socket timeout)")
    p.add_argument("--seed", type=int, default=1, help="seed of every random choice (1)")
    p.add_argument("--progress-s", type=float, default=None,
                   help="seconds between progress lines (default: a 30th of the run, >= 5)")
    p.add_argument("--log-dir", default=None, help="daemon logs here (default: a temp dir)")


def run(args) -> int:
    from pp1q.tools.chaos.soak import ChaosError, run_soak

    seconds = args.seconds if args.seconds is not None else (
        60.0 * args.minutes if args.minutes is not None else 60.0)
    if seconds <= 0 or args.concurrency < 1:
        print("pp1q soak: --minutes/--seconds and --concurrency must be positive",
              file=sys.stderr)
        return 2
    cfg = (_real_config if args.model == "embedded" else _toy_config)(args, seconds)
    if isinstance(cfg, str):
        print(f"pp1q soak: {cfg}", file=sys.stderr)
        return 2
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="pp1q-soak-")
    supports = ", ".join("dense" if k is None else f"top {k}" for k in cfg.top_ks)
    model = "SmolLM2-135M (embedded), " if cfg.model else ""
    print(f"pp1q soak: {seconds:g} s, {model}{cfg.concurrency} concurrent requests, vocab "
          f"{cfg.vocab} ({supports}),"
          f" watchdog {cfg.watchdog_ms} ms, clients leave {cfg.abandon_p:g}, seed {cfg.seed};"
          f" daemon logs in {log_dir}",
          flush=True)
    # SIGTERM unwinds like Ctrl-C, so the daemons are stopped and not left orphaned
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        report = run_soak(cfg, log_dir, progress=lambda line: print(line, flush=True))
    except ChaosError as e:  # the harness's own failure: no report to print
        print(f"pp1q soak: {e}", file=sys.stderr)
        return 1
    print(report.format(), flush=True)
    return 1 if report.problems() else 0


def _checked(args, abandon_p: float, hang_s: float) -> str | None:
    """The refusal of the options both models share, or None."""
    abandon_p = abandon_p if args.abandon_p is None else args.abandon_p
    hang_s = hang_s if args.hang_s is None else args.hang_s
    if not 0.0 <= abandon_p <= 1.0 or not hang_s > 0:
        return "--abandon-p must be in [0, 1] and --hang-s positive"
    return None


def _toy_config(args, seconds: float):
    """The toy soak's SoakConfig, or the refusal (a str)."""
    from pp1q.runtime.settings import MAX_VOCAB, MIN_VOCAB
    from pp1q.tools.chaos.soak import (
        ABANDON_P,
        DEFAULT_TOP_KS,
        DEFAULT_VOCAB,
        HANG_S,
        STREAMED_SPARSE_TOP_KS,
        STREAMED_SPARSE_VOCAB,
        SoakConfig,
    )

    if (why := _checked(args, ABANDON_P, HANG_S)) is not None:
        return why
    streamed = args.streamed_sparse
    vocab = args.vocab if args.vocab is not None else (
        STREAMED_SPARSE_VOCAB if streamed else DEFAULT_VOCAB)
    if not MIN_VOCAB <= vocab <= MAX_VOCAB:  # the daemons' own bounds: refused here, at once
        return f"--vocab must be in {MIN_VOCAB}..{MAX_VOCAB}"
    return SoakConfig(
        seconds=seconds, concurrency=args.concurrency, vocab=vocab,
        top_ks=STREAMED_SPARSE_TOP_KS if streamed else DEFAULT_TOP_KS,
        watchdog_ms=300 if args.watchdog_ms is None else args.watchdog_ms,
        target_delay_ms=40.0 if args.target_delay_ms is None else args.target_delay_ms,
        crash_every_s=300.0 if args.crash_every_s is None else args.crash_every_s,
        seed=args.seed, progress_s=_progress(args, seconds),
        abandon_p=ABANDON_P if args.abandon_p is None else args.abandon_p,
        hang_s=HANG_S if args.hang_s is None else args.hang_s)


def _real_config(args, seconds: float):
    """The real-model soak's SoakConfig (its model de-quantized into the cache first, as
    ``pp1q demo`` does), or the refusal (a str)."""
    from pp1q.tools.chaos.real_soak import REAL_ABANDON_P, REAL_HANG_S, real_config
    from pp1q.tools.demo_real import DEFAULT_EARLY_EXIT
    from pp1q.tools.realmodel import INSTALL_HINT, default_cache, missing, model_args, warm_cache

    toy_only = [name for name, given in (("--vocab", args.vocab),
                                         ("--streamed-sparse", args.streamed_sparse),
                                         ("--target-delay-ms", args.target_delay_ms))
                if given is not None and given is not False]  # 0 is given too
    if toy_only:
        return f"{', '.join(toy_only)}: the toy's options, not the real model's"
    if (why := _checked(args, REAL_ABANDON_P, REAL_HANG_S)) is not None:
        return why
    if (why := missing()) is not None:
        return f"{INSTALL_HINT} ({why}); `pp1q soak` (the toy) needs neither"
    cache = default_cache()
    warm_cache(cache)
    given = {k: getattr(args, k) for k in ("watchdog_ms", "abandon_p", "hang_s",
                                           "crash_every_s") if getattr(args, k) is not None}
    return real_config(seconds, tuple(model_args(DEFAULT_EARLY_EXIT, cache)),
                       concurrency=args.concurrency, seed=args.seed,
                       progress_s=_progress(args, seconds), **given)


def _progress(args, seconds: float) -> float:
    return args.progress_s or max(5.0, seconds / 30)
