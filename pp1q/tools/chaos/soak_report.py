"""The soak's report (pp1q.tools.chaos.soak): what the run counted, the checks that make
it PASS or FAIL (``problems``), and the summary lines ``pp1q soak`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field

from pp1q.tools.chaos.leave import STAGES

RSS_GROWTH_BOUND_KIB = 32 * 1024  # per daemon, warm-up to end: pools are preallocated


@dataclass
class SoakReport:
    seconds: float = 0.0
    requests: int = 0
    tokens: int = 0
    failed: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)  # requests that took hang_s
    slowest_s: float = 0.0  # of the requests read to their end
    left: dict[str, int] = field(default_factory=dict)  # clients that left, by stage
    model: bool = False  # a real model's soak (its own summary line)
    texts: int = 0  # requests read to their end with a text prompt, streamed
    stopped: int = 0  # requests read to their end that ended early saying "stop"
    left_speculative: int = 0  # of them (finished ones aside), speculative requests
    ended_early: int = 0  # requests the verifier counted as error or left_queued
    left_after: dict[str, int] = field(default_factory=dict)  # left one by one after the load
    probe: str = ""  # the liveness check's problem ('' none)
    probe_s: float | None = None  # its last probe's seconds; None: not run (a request hung)
    fallbacks: dict[str, int] = field(default_factory=dict)
    validation: dict[str, int] = field(default_factory=dict)
    injections: dict[str, int] = field(default_factory=dict)
    fired_on: dict[str, int] = field(default_factory=dict)  # frame faults by message type
    worker_restarts: int = 0
    worker_reads_cut: int = 0  # slot samples or RSS reads of the worker a crash cut
    reconnects: int = 0
    late_discarded: dict[str, int] = field(default_factory=dict)  # by reason
    verified_rounds: int = 0
    audit_commits: int = 0
    audit_proposal_commits: int = 0  # of them, proposals that came as one PROPOSAL frame
    audit_streamed_sparse_commits: int = 0  # ...and sparse proposals streamed as REPLY rows
    audit_sampled_rows: int = 0
    audit_violations: list[str] = field(default_factory=list)
    slots_hwm: dict[str, int] = field(default_factory=dict)
    slots_left: dict[str, int] = field(default_factory=dict)
    queued_left: int = 0  # the verifier's requests waiting for a slot, after the run
    rss_kib: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # start, warm, end
    # the warm-up's requests ended before the run did: else RSS growth is not checked (the
    # start figure holds no model's first rounds: a short real-model run grew 500 MiB)
    warmed: bool = True
    warmup_requests: int = 0
    # a real model's first worker just before its kill (after warm-up; None: not read)
    worker_killed_rss_kib: int | None = None

    def problems(self) -> list[str]:
        out = [f"request failed: {f}" for f in self.failed[:5]]
        out += [f"request hung: {h}" for h in self.hung[:5]]
        out += [f"liveness: {self.probe}"] if self.probe else []
        out += [f"audit: {v}" for v in self.audit_violations[:5]]
        out += [f"{role} holds {n} slots after the run" for role, n in self.slots_left.items()
                if n]
        out += [f"verifier queues {self.queued_left} requests after the run"] \
            if self.queued_left else []
        for role, (_start, warm, end) in (self.rss_kib.items() if self.warmed else ()):
            if role == "worker" and self.worker_restarts:
                if self.worker_killed_rss_kib is None:
                    continue  # the end figure is of a newer worker process
                end = self.worker_killed_rss_kib  # the first worker's, before its kill
            if end - warm > RSS_GROWTH_BOUND_KIB:
                out.append(f"{role} RSS grew {(end - warm) / 1024:.1f} MiB after warm-up "
                           f"(bound {RSS_GROWTH_BOUND_KIB / 1024:.0f} MiB)")
        if self.requests == 0:
            out.append("no request completed")
        return out

    def _left(self) -> str:
        stages = ", ".join(f"{s} {self.left.get(s, 0)}" for s in STAGES)
        return (f"{sum(self.left.get(s, 0) for s in STAGES)} ({stages};"
                f" {self.left_speculative} speculative), {self.left.get('finished', 0)}"
                f" streams finished before their client left; the verifier ended"
                f" {self.ended_early} requests early (error or left_queued)")

    def _liveness(self) -> str:
        left = ", ".join(f"{k} {v}" for k, v in sorted(self.left_after.items())) or "none"
        if self.probe_s is None:
            return "not checked (a request hung during the load)"
        return self.probe or (f"speculation served; {sum(self.left_after.values())}"
                              f" speculative streams left one by one ({left}), then a"
                              f" speculative round in {self.probe_s:.1f} s")

    def format(self) -> str:
        def kv(d: dict) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(d.items()) if v) or "none"
        rss = "; ".join(f"{role} {s / 1024:.1f} -> {w / 1024:.1f} -> {e / 1024:.1f} MiB"
                        for role, (s, w, e) in self.rss_kib.items())
        lines = [
            f"soak summary: {self.seconds / 60:.1f} min, {self.requests} requests completed,"
            f" {self.tokens} tokens, {len(self.failed)} failed, {len(self.hung)} hung"
            f" (slowest read to its end {self.slowest_s:.1f} s)",
            *([f"  real model: {self.texts} text prompts streamed back, {self.stopped}"
               f" requests ended early by EOS or a stop string"] if self.model else []),
            f"  clients that left: {self._left()}",
            f"  liveness after the run: {self._liveness()}",
            f"  verified rounds {self.verified_rounds}; wire audit: {self.audit_commits} commits"
            f" ({self.audit_proposal_commits} by PROPOSAL, {self.audit_streamed_sparse_commits}"
            f" sparse streamed as REPLY rows), {self.audit_sampled_rows} sampled"
            f" rows checked for q, {len(self.audit_violations)} violations",
            f"  fallbacks by cause: {kv(self.fallbacks)}",
            f"  validation failures by reason: {kv(self.validation)}",
            f"  injected: {kv(self.injections)}; worker restarts {self.worker_restarts}"
            f" ({self.worker_reads_cut} reads of the worker cut by them)",
            f"  frame faults fired by frame type: {kv(self.fired_on)}",
            f"  reconnects {self.reconnects}, late frames discarded by reason: "
            f"{kv(self.late_discarded)}",
            f"  slot high-water mark: {kv(self.slots_hwm)}; held after the run: "
            f"{', '.join(f'{k} {v}' for k, v in self.slots_left.items())};"
            f" verifier queue {self.queued_left}",
            f"  RSS start -> after warm-up -> end: {rss}"
            + (" (worker: the end figure is of the process started last)"
               if self.worker_restarts else "")
            + (f"; the first worker before its kill {self.worker_killed_rss_kib / 1024:.1f} MiB"
               if self.worker_killed_rss_kib is not None else "")
            + ("" if self.warmed else f"; growth not checked: the run ended before the "
               f"warm-up's {self.warmup_requests} requests (run longer)"),
            f"  result: {'PASS' if not self.problems() else 'FAIL: ' + '; '.join(self.problems())}",
        ]
        return "\n".join(lines)
