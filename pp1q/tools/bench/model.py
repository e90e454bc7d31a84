"""``pp1q bench model``: the embedded SmolLM2-135M served by both daemons, the worker
drafting with its first k layers (early exit; plain, or with the shipped exit adapter,
pp1q.models.exit_adapter), the two daemons pinned to different cores (``taskset``) to
stand in for two machines.

For each early-exit depth k, adapter (``none``; ``auto``: the shipped map for k, skipped
where none ships), draft depth D and target temperature T (the draft temperature is T too),
the same prompts run speculative and target-only, one request at a time, every
request exactly ``tokens`` long (ignore_eos). Measured, same run: acceptance
(accepted / drafted), accepted drafts per round, committed tokens per target forward
(prefill excluded), and the verifier's CPU seconds per committed token, speculative vs
target-only (read from /proc: with the verifier alone on its core this is the time it
is busy, what a verifier machine would spend). Wall-clock tokens/s is printed too, but
on one machine it also pays for the worker's forwards, which two machines overlap.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

TITLE = ("Real model: embedded SmolLM2-135M, early-exit drafters, worker and verifier "
         "on separate cores")
KS = (8, 16, 24, 28)  # early-exit depths of the table (30 layers in all)
ADAPTERS = ("none", "auto")  # plain exit, then the shipped map where one ships
TEMPERATURES = (0.7, 1.0)
TOKENS = 24  # per request, 3 prompts: the full sweep takes about 12 min on 2 busy cores
QUICK_TOKENS = 8
DEPTHS = (5,)  # drafts per round: the verifier's default depth
PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works to a child.",
    "What should I pack for a week of hiking?",
)
Q_SUPPORT = None  # dense q: a top-k q loses acceptance where p's tail is wide (T = 1)
WARMUP_TOKENS = 4  # one request per pair before measuring (first-call allocations)


def cpu_seconds(pid: int) -> float | None:
    """user + system CPU seconds of process ``pid`` (all its threads), or None off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    """One batch of requests on one pair: totals of the answers' stats and CPU time."""

    tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    target_only: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    verifier_cpu_s: float | None = None
    worker_cpu_s: float | None = None
    full_rounds: int | None = None  # rounds that accepted every draft (verifier metrics)

    @property
    def alpha(self) -> float | None:
        """Per-position acceptance: accepted / (accepted + rejections); a round ends in a
        rejection unless it accepted all its drafts (the geometric estimate)."""
        if self.full_rounds is None:
            return None
        trials = self.accepted + self.rounds - self.full_rounds
        return self.accepted / trials if trials else None

    @property
    def forwards(self) -> int:  # target forwards after the prefill
        return self.rounds + self.target_only

    def per_token(self, seconds: float | None) -> float | None:
        return None if seconds is None or not self.tokens else seconds / self.tokens


def pin_cores() -> tuple[tuple[str, str] | None, str]:
    """(worker cores, verifier cores) for taskset, and a note saying what was done."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if shutil.which("taskset") is None:
        return None, "note: taskset not found: the daemons share every core (not pinned)"
    if len(cpus) < 2:
        return None, "note: fewer than 2 cores available: the daemons are not pinned"
    return (str(cpus[0]), str(cpus[1])), (f"worker pinned to core {cpus[0]}, verifier to "
                                          f"core {cpus[1]} (taskset)")


def batch(url: str, pair, *, speculative: bool, temperature: float, tokens: int,
          prompts=PROMPTS, depth: int = DEPTHS[0]) -> Run:
    from pp1q.tools.client import Client
    from pp1q.tools.realmodel import accepted_lengths

    worker, verifier = pair
    worker_pid, verifier_pid = worker.proc.pid, verifier.proc.pid
    run = Run()
    client = Client(url)
    h0 = accepted_lengths(verifier.metrics_port)
    v0, w0 = cpu_seconds(verifier_pid), cpu_seconds(worker_pid)
    t0 = time.perf_counter()
    try:
        for i, prompt in enumerate(prompts):
            a = client.generate(prompt, tokens, seed=1000 + i, chat=True, ignore_eos=True,
                                speculative=speculative, temperature=temperature,
                                draft_temperature=temperature, top_k=Q_SUPPORT)
            s = a["stats"]
            run.tokens += len(a["token_ids"])
            run.rounds += s["rounds"]
            run.drafted += s["drafted"]
            run.accepted += s["accepted"]
            run.target_only += s["target_only_steps"]
            for cause, n in s["fallbacks"].items():
                if n:
                    run.fallbacks[cause] = run.fallbacks.get(cause, 0) + n
    finally:
        client.close()
    run.wall_s = time.perf_counter() - t0
    h1 = accepted_lengths(verifier.metrics_port)
    if len(h0) > depth and len(h1) > depth:
        run.full_rounds = h1[depth] - h0[depth]
    v1, w1 = cpu_seconds(verifier_pid), cpu_seconds(worker_pid)
    run.verifier_cpu_s = None if v0 is None or v1 is None else v1 - v0
    run.worker_cpu_s = None if w0 is None or w1 is None else w1 - w0
    return run


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{1000 * x:.0f}"


def _load_line(log_path: str) -> str | None:
    import re

    with open(log_path) as f:
        m = re.search(r"loaded in ([0-9.]+) s", f.read())
    return m.group(1) if m else None


@dataclass(frozen=True)
class Drafter:
    """One configuration of the sweep: exit k, exit adapter, drafts per round."""

    k: int
    adapter: str
    depth: int

    def label(self) -> str:
        return f"k={self.k} {self.adapter} D={self.depth}"


def sweep(ks, adapters, depths) -> tuple[list[Drafter], list[str]]:
    """The configurations to run, and a note for each adapter asked for but not shipped."""
    from pp1q.models.embedded import smollm2_gguf
    from pp1q.models.exit_adapter import shipped_adapter
    from pp1q.models.hf import checkpoint_identity

    identity = checkpoint_identity(smollm2_gguf()) if "auto" in adapters else ""
    out, notes = [], []
    for k in ks:
        for adapter in adapters:
            if adapter == "auto" and shipped_adapter(identity, k) is None:
                notes.append(f"k={k}: no shipped exit adapter (pp1q train-adapter --k {k})")
                continue
            out += [Drafter(k, adapter, d) for d in depths]
    return out, notes


def run(quick: bool, k: list[int] | None = None, temperatures: list[float] | None = None,
        tokens: int | None = None, adapters: list[str] | None = None,
        depths: list[int] | None = None) -> Iterator[str]:
    from pp1q.runtime.launcher import start_pair
    from pp1q.tools.realmodel import bench_skip, default_cache, model_args, warm_cache

    skipped = bench_skip()
    if skipped is not None:
        yield skipped
        return
    temps = list(temperatures or TEMPERATURES)
    n_tokens = tokens or (QUICK_TOKENS if quick else TOKENS)
    prompts = PROMPTS[:1] if quick else PROMPTS
    drafters, notes = sweep(list(k or KS), list(adapters or ADAPTERS), list(depths or DEPTHS))
    cores, note = pin_cores()
    yield note
    yield from notes
    yield (f"{len(prompts)} chat prompts x {n_tokens} tokens, one request at a time, dense q, "
           f"draft temperature = target temperature; T in {temps}; drafters: "
           + ", ".join(d.label() for d in drafters))
    cache = default_cache()
    parsed = warm_cache(cache, say=lambda line: None)
    if parsed is not None:
        yield f"model load: GGUF parsed and de-quantized in {parsed:.1f} s (cache filled)"
    if not quick and parsed is None:
        yield from _gguf_load_time()
    baseline: dict[float, Run] = {}
    results: list[tuple[Drafter, float, Run]] = []
    for d in drafters:
        log_dir = tempfile.mkdtemp(prefix="pp1q-bench-model-")
        t0 = time.perf_counter()
        worker, verifier, url = start_pair(log_dir, model=model_args(d.k, cache, d.adapter),
                                           verifier_args=["--depth", str(d.depth)],
                                           cores=cores)
        try:
            loads = [_load_line(p.log_path) for p in (worker, verifier)]
            yield (f"{d.label()}: pair up in {time.perf_counter() - t0:.1f} s (cached model "
                   f"load: worker {loads[0]} s, verifier {loads[1]} s)")
            pids = (worker, verifier)
            batch(url, pids, speculative=True, temperature=1.0, tokens=WARMUP_TOKENS,
                  prompts=prompts[:1], depth=d.depth)
            for t in temps:
                if t not in baseline:
                    baseline[t] = b = batch(url, pids, speculative=False, temperature=t,
                                            tokens=n_tokens, prompts=prompts)
                    yield (f"  target-only T={t}: {b.tokens} tokens, verifier "
                           f"{_ms(b.per_token(b.verifier_cpu_s))} ms/token, "
                           f"{b.tokens / b.wall_s:.2f} tokens/s")
                r = batch(url, pids, speculative=True, temperature=t, tokens=n_tokens,
                          prompts=prompts, depth=d.depth)
                results.append((d, t, r))
                yield "  " + _line(d, t, r, baseline[t])
        finally:
            verifier.stop()
            worker.stop()
    yield ""
    yield from _table(results, baseline)


def _gguf_load_time() -> Iterator[str]:
    """The load a daemon without a cache pays: the GGUF parsed and de-quantized."""
    from pp1q.models.embedded import smollm2_gguf
    from pp1q.models.hf import load_checkpoint
    from pp1q.tools.realmodel import quiet_progress_bars

    quiet_progress_bars()
    t0 = time.perf_counter()
    ckpt = load_checkpoint(smollm2_gguf())
    yield (f"model load: {time.perf_counter() - t0:.1f} s from the GGUF (no cache), "
           f"in this process; {ckpt.vocab} ids")
    del ckpt


def _ratio(base: Run, r: Run) -> float | None:
    b, s = base.per_token(base.verifier_cpu_s), r.per_token(r.verifier_cpu_s)
    return None if b is None or s is None or s == 0 else b / s


def _line(d: Drafter, t: float, r: Run, base: Run) -> str:
    ratio = _ratio(base, r)
    return (f"{d.label()} T={t}: acceptance {_pct(r.alpha)} per position "
            f"({r.accepted}/{r.drafted} drafts), "
            f"{r.accepted / max(r.rounds, 1):.2f} accepted drafts/round, "
            f"{r.tokens / max(r.forwards, 1):.2f} tokens/target forward, verifier "
            f"{_ms(r.per_token(r.verifier_cpu_s))} ms/token (target-only "
            f"{_ms(base.per_token(base.verifier_cpu_s))}: "
            f"{'n/a' if ratio is None else f'x{ratio:.2f}'}), "
            f"{r.tokens / r.wall_s:.2f} tokens/s, fallbacks "
            f"{', '.join(f'{c}={n}' for c, n in r.fallbacks.items()) or 'none'}")


def _table(results, baseline) -> Iterator[str]:
    yield ("| k | adapter | D | T | acceptance per position | accepted/drafted | accepted/round | "
           "tokens/target fwd | verifier ms/token spec | target-only | fewer verifier-s (x) | "
           "worker ms/token | tokens/s spec | target-only | fallbacks |")
    yield "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    for d, t, r in results:
        base = baseline[t]
        ratio = _ratio(base, r)
        yield (f"| {d.k} | {d.adapter} | {d.depth} | {t} | {_pct(r.alpha)} | "
               f"{r.accepted / max(r.drafted, 1):.1%} | "
               f"{r.accepted / max(r.rounds, 1):.2f} | {r.tokens / max(r.forwards, 1):.2f} | "
               f"{_ms(r.per_token(r.verifier_cpu_s))} | "
               f"{_ms(base.per_token(base.verifier_cpu_s))} | "
               f"{'n/a' if ratio is None else f'{ratio:.2f}'} | "
               f"{_ms(r.per_token(r.worker_cpu_s))} | {r.tokens / r.wall_s:.2f} | "
               f"{base.tokens / base.wall_s:.2f} | "
               f"{', '.join(f'{c}={n}' for c, n in r.fallbacks.items()) or 'none'} |")
    best = max(results, key=lambda x: _ratio(baseline[x[1]], x[2]) or 0.0, default=None)
    if best is not None:
        ratio = _ratio(baseline[best[1]], best[2])
        goal = "met" if ratio is not None and ratio >= 1.5 else "NOT met"
        yield ""
        yield (f"best drafter: {best[0].label()} at T={best[1]}: x"
               f"{'n/a' if ratio is None else f'{ratio:.2f}'} fewer verifier-seconds per "
               f"token than target-only (goal >= 1.5x: {goal})")
