"""Soak: concurrent requests against real daemons for a while, with random faults.

``run_soak`` starts a worker, the fault proxy and a verifier (pp1q.tools.chaos.rig), keeps
``concurrency`` requests in flight until the time is up (random prompts, lengths, seeds
and proposal supports, all from one seeded generator), and meanwhile:

- every REPLY / COMPLETION frame may take a random frame fault (drop, bit flip,
  truncate, duplicate, reorder, stale replay, a delay past the watchdog, a disconnect
  in the middle of a frame), each with a small fixed probability, and so may every
  PROPOSAL (the one frame a sparse step whose rows fit it is answered with: at the
  default vocabulary 1024 the top-8 and top-32 steps; the same kinds,
  ``faults.random_frame_rules``). ``top_ks`` says which supports the requests draw
  from; the streamed sparse soak (vocabulary 16, top 3, 4 and 8) makes most sparse
  steps too large for one PROPOSAL, so they stream sparse REPLY rows and a COMPLETION;
- a chaos thread injects stream faults at random times (a pause or a blackhole longer
  than the watchdog, a reset of the connection) and, every ``crash_every_s``, kills the
  worker and starts a new one on the same port;
- a request's client may leave (``abandon_p``, its own seeded draws): the connection
  closed at a random moment, before the answer or mid-stream, plain or streamed,
  speculative or target-only (pp1q.tools.chaos.leave).

It reports requests completed, hung (taking ``hang_s``) and clients that left by stage,
fallbacks by cause, validation failures by reason,
injections by kind, the slot high-water marks (sampled from /metrics), RSS of both
daemons (/proc/PID/status) at start, after warm-up and at the end, and checks: no
request failed, hung or came back short, speculation still works after the load (a
speculative round is counted: pp1q.tools.chaos.liveness), the wire audit found nothing,
no slot is held and no request queued once the requests are done, and RSS growth after
warm-up stays within ``RSS_GROWTH_BOUND_KIB`` (32 MiB; the report and its checks:
pp1q.tools.chaos.soak_report).

The same runs on a real model (``SoakConfig.model``, the daemons' options naming it;
its defaults: pp1q.tools.chaos.real_soak): there the first worker kill waits for the
warm-up's RSS figure, and the first worker's RSS is read just before its kill and
checked as its end figure (past a restart the toy's worker is not checked).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pp1q.core.outcomes import FallbackCause
from pp1q.runtime.launcher import STARTUP_TIMEOUT_S, STOP_TIMEOUT_S
from pp1q.tools.chaos import liveness
from pp1q.tools.chaos.crash_window import RSS_ERRORS, CrashWindow
from pp1q.tools.chaos.faults import Direction, Rule, random_frame_rules
from pp1q.tools.chaos.load import Load
from pp1q.tools.chaos.rig import Rig, delta, value
from pp1q.tools.chaos.soak_report import SoakReport
from pp1q.wire.events import DISCARD_REASONS

WARMUP_REQUESTS = 40  # RSS baseline after these (imports, pools, allocator arenas settle)
SETTLE_S = 10.0  # after the last request: slots must be free by then
# the chaos thread's end: a worker restart it is in (kill, the new worker's start, each
# with its own bound: pp1q.runtime.launcher) runs to its end, then a margin
CHAOS_JOIN_S = 0.5 + STARTUP_TIMEOUT_S + 3 * STOP_TIMEOUT_S + 10.0
WARM_POLL_S = 1.0  # a real model's first crash, due before the warm-up ended: checked again
SAMPLE_S = 0.25  # slot gauge sampling period (the high-water mark is a sampled maximum)
FRAME_FAULT_P = 0.002  # per matching frame and fault kind
PROPOSAL_FAULT_P = 5 * FRAME_FAULT_P  # one PROPOSAL carries the 5 rows of a step (depth 5)
STREAM_FAULT_MEAN_S = 8.0  # mean gap between stream faults (exponential)
ABANDON_P = 0.02  # per request: its client leaves at a random moment (pp1q.tools.chaos.leave)
# a request the verifier no longer moves: no request of the mix comes near it (4..48
# tokens at a 40 ms target step each, under faults and a worker restart: a few seconds)
HANG_S = 30.0
JOIN_MARGIN_S = 10.0  # past hang_s, for a load thread to end once its request did
# Proposal supports the requests draw from (None: dense q). At vocabulary 1024 a session's
# frame bound is 4096 bytes, so depth-5 top-8 and top-32 steps each fit one PROPOSAL.
DEFAULT_VOCAB = 1024
DEFAULT_TOP_KS: tuple[int | None, ...] = (None, 8, 32)
# The streamed sparse soak (``pp1q soak --streamed-sparse``): at vocabulary 16 the frame
# bound is max(4 x 16, 8 x 16) = 128 bytes (sizes.proposal_fits), so a depth-5 top-3 step
# (120 bytes) is one PROPOSAL, top-4 (160) and top-8 (320) steps stream sparse REPLY
# rows and a COMPLETION: both sides of the line, and no dense q
STREAMED_SPARSE_VOCAB = 16
STREAMED_SPARSE_TOP_KS: tuple[int | None, ...] = (3, 4, 8)


@dataclass
class SoakConfig:
    seconds: float
    concurrency: int = 4
    vocab: int = DEFAULT_VOCAB
    top_ks: tuple[int | None, ...] = DEFAULT_TOP_KS  # each request draws one (None: dense)
    watchdog_ms: int = 300
    target_delay_ms: float = 40.0  # simulated forward pass: keeps the soak near one core
    crash_every_s: float = 300.0  # worker kill + restart period (0: never)
    seed: int = 1
    progress_s: float = 10.0
    abandon_p: float = ABANDON_P  # per request: its client leaves (0: every one read to its end)
    hang_s: float = HANG_S  # a request this long is hung (each client's socket timeout)
    # the real-model soak sets these (pp1q.tools.chaos.real_soak); the toy's defaults here
    model: tuple[str, ...] = ()  # both daemons' real-model options (empty: the toy pair)
    prompt_ids: tuple[int, int] = (2, 16)  # id prompt lengths, drawn uniformly between
    max_tokens: tuple[int, int] = (4, 48)  # each request's, drawn uniformly between
    text_p: float = 0.0  # requests with a text prompt, streamed (a real model only)
    warmup_requests: int = WARMUP_REQUESTS
    stream_fault_mean_s: float = STREAM_FAULT_MEAN_S


def frame_rules(rng: random.Random, watchdog_s: float) -> list[Rule]:
    """One random rule per frame fault kind and frame (faults.random_frame_rules)."""
    return random_frame_rules(rng, watchdog_s, row_p=FRAME_FAULT_P, stall_p=FRAME_FAULT_P,
                              proposal_p=PROPOSAL_FAULT_P, disconnect_p=FRAME_FAULT_P / 4,
                              bit_offset=rng.randrange(1 << 16))


class ChaosError(RuntimeError):
    """The soak's own fault injection failed (a worker that did not start again): the
    soak cannot go on, and the cause is this, not the scrapes that then fail."""


def _chaos_thread(failures: list[BaseException], *args) -> None:
    try:
        _chaos(*args)
    except BaseException as e:  # noqa: BLE001 - reported by run_soak, in its own thread
        failures.append(e)


def _chaos(rig: Rig, cfg: SoakConfig, rng: random.Random, stop: threading.Event,
           restarts: list[int], crashes: CrashWindow, killed_rss: list[int],
           warmed: threading.Event) -> None:
    hold = 2 * cfg.watchdog_ms / 1000.0
    next_crash = time.monotonic() + cfg.crash_every_s if cfg.crash_every_s else float("inf")
    while True:
        gap = min(rng.expovariate(1.0 / cfg.stream_fault_mean_s), next_crash - time.monotonic())
        if stop.wait(max(0.0, gap)):
            return
        if time.monotonic() >= next_crash and cfg.model and not warmed.is_set():
            # a real model's warm-up takes minutes, longer on a slower machine: its first
            # crash waits for the RSS baseline, so that the first worker's growth after
            # warm-up is read before its kill, whatever the machine's pace
            next_crash = time.monotonic() + WARM_POLL_S
            continue
        if time.monotonic() >= next_crash:
            with crashes.crash():
                if cfg.model and not restarts[0]:  # the first worker's last figure
                    killed_rss.append(rig.rss_kib("worker"))
                rig.crash_worker()
                stop.wait(0.5)
                rig.restart_worker()
            restarts[0] += 1
            next_crash += cfg.crash_every_s
            continue
        kind = rng.choice(["pause", "blackhole", "reset"])
        if kind == "reset":
            rig.proxy.reset_all()
            continue
        direction = rng.choice(list(Direction))
        getattr(rig.proxy, kind)(direction)
        stop.wait(hold)
        getattr(rig.proxy, "un" + kind)(direction)


def run_soak(cfg: SoakConfig, log_dir: str | Path,
             progress: Callable[[str], None] = print) -> SoakReport:
    rng = random.Random(cfg.seed)
    rig = Rig(log_dir, vocab=cfg.vocab, preset="close", watchdog_ms=cfg.watchdog_ms,
              target_delay_ms=cfg.target_delay_ms, model=cfg.model)
    report = SoakReport()
    try:
        roles = ("verifier", "worker")
        start_rss = {r: rig.rss_kib(r) for r in roles}
        before = rig.metrics("verifier")
        rules = frame_rules(rng, cfg.watchdog_ms / 1000.0)
        rig.proxy.set_rules(rules)
        stop, chaos_stop = threading.Event(), threading.Event()
        load = Load(rig.url, cfg, stop)
        restarts, crashes, chaos_failures, killed_rss = [0], CrashWindow(), [], []
        warmed = threading.Event()
        chaos = threading.Thread(
            target=_chaos_thread,
            args=(chaos_failures, rig, cfg, rng, chaos_stop, restarts, crashes, killed_rss,
                  warmed), daemon=True)
        t0 = time.monotonic()
        for t in load.threads:
            t.start()
        chaos.start()
        hwm: Counter[str] = Counter()
        warm_rss: dict[str, int] = {}
        next_progress = t0 + cfg.progress_s
        while (now := time.monotonic()) < t0 + cfg.seconds:
            time.sleep(SAMPLE_S)
            _raise_chaos_failure(chaos_failures, rig)
            _sample_slots(rig, hwm, crashes)
            if not warm_rss and load.requests >= cfg.warmup_requests and not crashes.begun:
                # None: the first crash came meanwhile (no warm figure after one)
                worker_rss = crashes.read(lambda: rig.rss_kib("worker"), RSS_ERRORS)
                if worker_rss is not None:
                    warm_rss = {"verifier": rig.rss_kib("verifier"), "worker": worker_rss}
                    warmed.set()
            if now >= next_progress:
                next_progress += cfg.progress_s
                progress(_progress_line(rig, load, now - t0, restarts[0]))
        _stop_chaos(chaos, chaos_stop, chaos_failures, rig)
        rig.proxy.set_rules([])
        stop.set()
        for t in load.threads:  # each request ends within hang_s (its socket timeout)
            t.join(cfg.hang_s + JOIN_MARGIN_S)
        report.seconds = time.monotonic() - t0
        report.hung = list(load.hung)
        if not report.hung:  # one hung already shows it: the probe would wait as long
            left_after, report.probe, report.probe_s = liveness.check(rig, cfg.hang_s)
            report.left_after = dict(left_after)
        report.slots_left, report.queued_left = _wait_slots_free(rig)
        after = rig.metrics("verifier")
        report.requests, report.tokens, report.failed = load.requests, load.tokens, load.failed
        report.slowest_s, report.left = load.slowest_s, dict(load.left)
        report.left_speculative = load.left_speculative
        report.model, report.texts, report.stopped = bool(cfg.model), load.texts, load.stopped
        # a client gone mid-request: its request cancelled, counted as an error (none
        # other fails here) or, still waiting for a slot, left_queued
        report.ended_early = int(sum(delta(after, before, "pp1q_requests_total", outcome=o)
                                     for o in ("error", "left_queued")))
        report.fallbacks = {c.value: int(delta(after, before, "pp1q_fallbacks_total",
                                               cause=c.value)) for c in FallbackCause}
        report.validation = {dict(k[1])["reason"]: int(v - before.get(k, 0))
                             for k, v in after.items()
                             if k[0] == "pp1q_validation_failures_total"}
        report.injections = {k.value: v for k, v in rig.proxy.injections.items()}
        fired: Counter[str] = Counter()
        for r in rules:
            fired[r.msg_type.name] += r.fired
        report.fired_on = dict(fired)
        report.worker_restarts = restarts[0]
        report.worker_reads_cut = crashes.raced
        report.reconnects = int(delta(after, before, "pp1q_reconnects_total"))
        report.late_discarded = {r.value: int(delta(after, before,
                                                    "pp1q_late_replies_discarded_total",
                                                    reason=r.value)) for r in DISCARD_REASONS}
        report.verified_rounds = int(delta(after, before, "pp1q_rounds_total",
                                           kind="speculative"))
        audit = rig.audit
        report.audit_commits, report.audit_sampled_rows = audit.commits, audit.sampled_rows
        report.audit_proposal_commits = audit.proposal_commits
        report.audit_streamed_sparse_commits = audit.streamed_sparse_commits
        report.audit_violations = list(audit.violations)
        report.slots_hwm = dict(hwm)
        end_rss = {r: rig.rss_kib(r) for r in roles}
        # warmed is set exactly where warm_rss was taken
        report.warmed, report.warmup_requests = warmed.is_set(), cfg.warmup_requests
        warm_rss = warm_rss or start_rss
        report.rss_kib = {r: (start_rss[r], warm_rss[r], end_rss[r]) for r in roles}
        if killed_rss and report.warmed:
            report.worker_killed_rss_kib = killed_rss[0]
    finally:
        rig.close()
    return report


def _stop_chaos(chaos: threading.Thread, stop: threading.Event,
                failures: list[BaseException], rig: Rig, join_s: float | None = None) -> None:
    """Stop the chaos thread and raise its failure. It may be mid-restart (a restart
    does not heed ``stop``): waited for as long as a restart can take, and a thread
    still alive then is a ChaosError too, not a soak that goes on with its worker
    half-started (the next scrape's bare error, the restart's own failure never
    raised, a worker it starts after ``rig.close()`` left running)."""
    join_s = CHAOS_JOIN_S if join_s is None else join_s
    stop.set()
    chaos.join(join_s)
    _raise_chaos_failure(failures, rig)
    if chaos.is_alive():
        raise ChaosError(f"the soak's fault injection did not stop within {join_s:g} s "
                         f"(a worker restart under way)\n{rig.logs()}")


def _raise_chaos_failure(failures: list[BaseException], rig: Rig) -> None:
    if failures:
        e = failures[0]
        raise ChaosError(f"the soak's fault injection failed: {type(e).__name__}: {e}\n"
                         f"{rig.logs()}") from e


def _sample_slots(rig: Rig, hwm: Counter, crashes: CrashWindow) -> None:
    """The slot gauges into ``hwm``. The verifier is never crashed: a failed scrape of
    it fails the soak; one of the worker is skipped only where a crash cut it."""
    samples = {"verifier": rig.metrics("verifier"),
               "worker": crashes.read(lambda: rig.metrics("worker"))}
    for role, sample in samples.items():
        if sample is not None:
            hwm[role] = max(hwm[role], int(value(sample, "pp1q_slots_in_use")))


def _wait_slots_free(rig: Rig) -> tuple[dict[str, int], int]:
    """Slots held by each daemon, and requests the verifier queues for one, once none
    is (or SETTLE_S passed)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        verifier = rig.metrics("verifier")
        held = {"verifier": int(value(verifier, "pp1q_slots_in_use")),
                "worker": int(value(rig.metrics("worker"), "pp1q_slots_in_use"))}
        queued = int(value(verifier, "pp1q_requests_queued"))
        if not (any(held.values()) or queued) or time.monotonic() > deadline:
            return held, queued
        time.sleep(SAMPLE_S)


def _progress_line(rig: Rig, load: Load, elapsed: float, restarts: int) -> str:
    inj = sum(rig.proxy.injections.values())
    try:
        rss = f"RSS verifier {rig.rss_kib('verifier') / 1024:.0f} MiB, " \
              f"worker {rig.rss_kib('worker') / 1024:.0f} MiB"
    except (OSError, RuntimeError):
        rss = "RSS n/a"
    return (f"[{elapsed:7.0f} s] {load.requests} requests, {load.tokens} tokens, "
            f"{len(load.failed)} failed, {len(load.hung)} hung, {sum(load.left.values())}"
            f" clients leaving, {inj} faults injected, {restarts} worker restarts, "
            f"{rss}")
