"""The chaos matrix: one row per fault kind, against one shared pair of real daemons.

Each row installs deterministic fault rules on the proxy (or crashes the worker), runs
a few concurrent requests and checks, from three independent vantage points:

- the HTTP answers: every request completes with exactly max_tokens tokens, and its
  stats add up (accepted + verified rounds + target-only steps = tokens committed);
- the verifier's /metrics (deltas over the row): the fault's own counter equals the
  number of injections the proxy made, every verified proposal had all ``depth`` rows
  (drafted = depth x verified rounds), and fallbacks by cause equal the answers' own;
- the wire audit (pp1q.tools.chaos.audit): every COMMIT names a proposal delivered whole and
  intact with q(token) > 0 on every row, i.e. zero partial commits and zero sampled
  ids without q.

The sparse rows (faults on the PROPOSAL frame) are in sparse_rows.py, the distribution
row in distribution.py. Faults are chosen by frame position and count or by a seeded
generator, never by frame content: a fault that looks at the drafted token would select
on the draws themselves, which biases any speculative sampler (see RELIABILITY.md).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pp1q.core.outcomes import FallbackCause
from pp1q.tools.chaos.faults import (
    BitFlip,
    Delay,
    Direction,
    Disconnect,
    Drop,
    Duplicate,
    FaultKind,
    Reorder,
    Replay,
    Rule,
    Truncate,
)
from pp1q.tools.chaos.rig import Rig, Samples, delta, total, value
from pp1q.wire import MsgType

DEPTH = 5  # the verifier's default fixed depth
WATCHDOG_MS = 1000  # STEP watchdog of the matrix pair: a toy round takes ms, but on a loaded
# 2-core box a spurious timeout at 300 ms would add a fallback no row planned
PROMPT = [3, 7]
ROW_REQUESTS = 8  # per row, 4 at a time (bounded CI size)
ROW_TOKENS = 16
WAVE = 4  # requests per wave in rows that lose the connection (one fault per wave)
FLUSH_WAVES = 3  # fault-free waves that release replayed copies still held after a row
INJECTIONS = 3  # deterministic injections per row
EVERY = 4  # fire on every 4th matching frame: each injection hits another proposal
SETTLE_S = 15.0  # bound on waiting for late frames / counters after a row's requests
POLL_S = 0.05


@dataclass
class Deltas:
    before: Samples
    after: Samples

    def __call__(self, name: str, **labels) -> int:
        return int(delta(self.after, self.before, f"pp1q_{name}", **labels))

    def fallbacks(self) -> dict[str, int]:
        return {c.value: self("fallbacks_total", cause=c.value) for c in FallbackCause}

    def total(self, name: str) -> int:
        """``pp1q_<name>`` over every label set (e.g. late frames of every reason)."""
        return int(total(self.after, f"pp1q_{name}") - total(self.before, f"pp1q_{name}"))


@dataclass
class Case:
    name: str
    kind: FaultKind | None  # the proxy's injection counter for this row
    counter: str  # which counter must equal the injections
    rules: Callable[[], list[Rule]] = list
    expect: Callable[[Deltas, int], list[str]] = lambda d, n: []
    crash: bool = False  # the row kills and restarts the worker instead
    lossless: bool = True  # no connection loss: every verified round's COMMIT is on the wire
    top_k: int | None = None  # the requests' proposal support (None: dense q)
    proposals: bool = False  # every commit must name a proposal sent as one PROPOSAL frame


@dataclass
class RowResult:
    name: str
    counter: str
    injected: int = 0
    observed: str = ""
    requests: int = 0
    complete: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)
    audit: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def equal(what: str, got: int, want: int) -> list[str]:
    return [] if got == want else [f"{what} = {got}, want {want}"]


def reason_row(reason: str) -> Callable[[Deltas, int], list[str]]:
    """Each injection fails its open step for ``reason`` (one invalid_reply fallback),
    on the same connection. The failed step's later frames arrive for a reset generation:
    discarded as stale_generation (how many depends on timing), never as duplicate_round,
    which only a copy of a finished round of a live generation gets."""
    def expect(d: Deltas, n: int) -> list[str]:
        return (equal(f"validation_failures{{{reason}}}", d("validation_failures_total",
                                                             reason=reason), n)
                + equal("fallbacks{invalid_reply}", d("fallbacks_total",
                                                      cause="invalid_reply"), n)
                + equal("reconnects", d("reconnects_total"), 0)
                + equal("late_replies_discarded{duplicate_round}",
                        d("late_replies_discarded_total", reason="duplicate_round"), 0))
    return expect


def late(reason: str, n: int | None = None) -> Callable[[Deltas, int], list[str]]:
    """Frames discarded unread: ``n`` (None: one per injection), every one of them for
    ``reason`` (stale_generation or duplicate_round), none for another reason."""
    def expect(d: Deltas, injected: int) -> list[str]:
        want = injected if n is None else n
        return (equal(f"late_replies_discarded{{{reason}}}",
                      d("late_replies_discarded_total", reason=reason), want)
                + equal("late_replies_discarded (all reasons)",
                        d.total("late_replies_discarded_total"), want))
    return expect


def lost(d: Deltas, n: int) -> list[str]:
    short = d("fallbacks_total", cause="connection_lost") + \
        d("fallbacks_total", cause="worker_unavailable")
    return (equal("reconnects", d("reconnects_total"), n)
            + ([] if short >= n else [f"only {short} connection fallbacks for {n} losses"]))


def planned_rule(fault, mtype=MsgType.REPLY, index: int | None = 2) -> Callable[[], list[Rule]]:
    where = {} if index is None else {"index": index}
    return lambda: [Rule(fault, msg_type=mtype, where=where, nth=2, every=EVERY,
                         times=INJECTIONS)]


def cases(watchdog_s: float) -> list[Case]:
    def delay(d: Deltas, n: int) -> list[str]:
        return (equal("watchdog_timeouts", d("watchdog_timeouts_total"), n)
                + equal("fallbacks{watchdog_timeout}",
                        d("fallbacks_total", cause="watchdog_timeout"), n)
                + ([] if d("late_replies_discarded_total", reason="stale_generation") >= n
                   else ["the late COMPLETIONs were not all discarded as stale_generation"])
                + equal("late_replies_discarded{duplicate_round}",
                        d("late_replies_discarded_total", reason="duplicate_round"), 0))

    def replay(d: Deltas, n: int) -> list[str]:
        return (late("stale_generation")(d, n)
                + equal("fallbacks (all causes)", sum(d.fallbacks().values()), 0))

    def context_refused(d: Deltas, n: int) -> list[str]:
        # the worker refuses the corrupt CONTEXT, then the STEP after it with its reason:
        # one worker_refused fallback each, then the whole context is sent again
        return (equal("fallbacks{worker_refused}", d("fallbacks_total", cause="worker_refused"),
                      n)
                + equal("fallbacks (other causes)", sum(d.fallbacks().values()), n)
                + equal("reconnects", d("reconnects_total"), 0))

    return [
        Case("delay past watchdog", FaultKind.DELAY, "watchdog_timeouts",
             planned_rule(Delay(3 * watchdog_s), MsgType.COMPLETION, None), delay),
        Case("drop", FaultKind.DROP, "validation_failures{out_of_order}",
             planned_rule(Drop()), reason_row("out_of_order")),
        Case("bit flip", FaultKind.BIT_FLIP, "validation_failures{checksum_mismatch}",
             planned_rule(BitFlip("payload", offset=5, bit=3)), reason_row("checksum_mismatch")),
        Case("truncate", FaultKind.TRUNCATE, "validation_failures{unexpected_size}",
             planned_rule(Truncate(keep=4)), reason_row("unexpected_size")),
        Case("duplicate frame", FaultKind.DUPLICATE, "validation_failures{duplicate_round}",
             planned_rule(Duplicate()), reason_row("duplicate_round")),
        Case("context bit flip", FaultKind.BIT_FLIP, "fallbacks{worker_refused}",
             lambda: [Rule(BitFlip("payload", offset=1, bit=2), direction=Direction.TO_WORKER,
                           msg_type=MsgType.CONTEXT, nth=2, every=EVERY, times=INJECTIONS)],
             context_refused),
        Case("stale-generation replay", FaultKind.REPLAY,
             "late_replies_discarded{stale_generation}",
             planned_rule(Replay(), index=1), replay),
        Case("reorder", FaultKind.REORDER, "validation_failures{out_of_order}",
             planned_rule(Reorder()), reason_row("out_of_order")),
        Case("disconnect mid-reply", FaultKind.DISCONNECT, "reconnects",
             planned_rule(Disconnect(), index=3), lost, lossless=False),
        Case("worker crash and restart", None, "reconnects", crash=True, expect=lost,
             lossless=False),
    ]


def generate(rig: Rig, bodies: list[dict], concurrency: int = 4) -> list[dict]:
    local = threading.local()

    def one(body: dict) -> dict:
        if not hasattr(local, "client"):
            local.client = rig.client()
        return local.client.generate(PROMPT, body["max_tokens"], seed=body["seed"],
                                     top_k=body.get("top_k"))

    with cf.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, bodies))


def _crash_soon(rig: Rig, crashes: list[int]) -> None:
    """Kill the worker while a wave of requests runs, restart it on the same port. The
    kill waits until a request of the wave holds a slot (bounded): after a fixed sleep,
    on a loaded box, it could come before any request had started, costing none of them
    a fallback (the row then failed: fewer connection fallbacks than crashes)."""
    deadline = time.monotonic() + SETTLE_S
    while value(rig.metrics("verifier"), "pp1q_slots_in_use") < 1 and \
            time.monotonic() < deadline:
        time.sleep(POLL_S / 5)
    rig.crash_worker()
    crashes[0] += 1
    time.sleep(0.2)
    rig.restart_worker()


def _run_load(rig: Rig, case: Case, bodies: list[dict]) -> tuple[list[dict], int]:
    """The row's requests; a row that loses the connection runs one wave of four per
    injection and waits for the session to come back after each (else the rest of the
    row would run target-only and never meet the next fault). Returns (answers, crashes)."""
    if case.lossless:
        return generate(rig, bodies), 0
    answers, crashes = [], [0]
    for i in range(0, len(bodies), WAVE):
        crasher = threading.Thread(target=_crash_soon, args=(rig, crashes)) \
            if case.crash else None
        if crasher is not None:
            crasher.start()
        answers += generate(rig, bodies[i:i + WAVE])
        if crasher is not None:
            crasher.join(SETTLE_S)
        rig.wait_session()
    return answers, crashes[0]


def run_case(rig: Rig, case: Case, requests: int = ROW_REQUESTS, first_seed: int = 1,
             tokens: int = ROW_TOKENS) -> RowResult:
    row = RowResult(case.name, case.counter)
    if not case.lossless:
        requests = max(requests, WAVE * INJECTIONS)
    audit = rig.audit
    a0 = (audit.commits, audit.committed_drafts, len(audit.violations), audit.proposal_commits)
    inj0 = Counter(rig.proxy.injections)
    before = rig.metrics("verifier")
    rig.proxy.set_rules(case.rules())
    bodies = [{"max_tokens": tokens, "seed": first_seed + i, "top_k": case.top_k}
              for i in range(requests)]
    try:
        answers, crashes = _run_load(rig, case, bodies)
    finally:
        rig.proxy.set_rules([])
    answers += _release_replays(rig, first_seed + len(bodies), tokens, case.top_k)
    requests = len(answers)
    injected = crashes if case.crash else rig.proxy.injections[case.kind] - inj0[case.kind]
    d = _settle(rig, case, before, injected)
    row.injected, row.requests = injected, requests
    row.complete = sum(len(a["token_ids"]) == tokens for a in answers)
    row.fallbacks = {k: v for k, v in d.fallbacks().items() if v}
    row.observed = _observed(case, d)
    row.problems = case.expect(d, injected) + _common(case, d, answers, requests, tokens)
    if injected != INJECTIONS:
        row.problems.append(f"{injected} injections made, {INJECTIONS} planned")
    spec_rounds = sum(a["stats"]["rounds"] for a in answers)
    deadline = time.monotonic() + SETTLE_S  # the last COMMITs may still be in the proxy
    while case.lossless and audit.commits - a0[0] < spec_rounds and time.monotonic() < deadline:
        time.sleep(POLL_S)
    commits = audit.commits - a0[0]
    row.audit = f"{commits} commits, {len(audit.violations) - a0[2]} violations"
    row.problems += list(audit.violations[a0[2]:])[:3]
    accepted = sum(a["stats"]["accepted"] for a in answers)
    drafts = audit.committed_drafts - a0[1]
    if case.lossless and (commits, drafts) != (spec_rounds, accepted):
        row.problems.append(f"audit saw {commits} commits / {drafts} drafts, answers say "
                            f"{spec_rounds} / {accepted}")
    if not case.lossless and (commits > spec_rounds or drafts > accepted):
        row.problems.append("audit saw more commits than the answers report")
    by_proposal = audit.proposal_commits - a0[3]
    if by_proposal != (commits if case.proposals else 0):
        row.problems.append(f"{by_proposal} of {commits} commits came as one PROPOSAL frame")
    return row


def _release_replays(rig: Rig, first_seed: int, tokens: int, top_k) -> list[dict]:
    """A replayed copy goes out before its slot's next generation: one held from a slot's
    last request of the row waits for a request the row may never send (which slot
    serves which request is the daemons' timing). Waves of WAVE more requests, fault-free,
    until none is held (at most FLUSH_WAVES): each wave moves every slot to a new
    generation."""
    answers: list[dict] = []
    for _ in range(FLUSH_WAVES):
        if not rig.proxy.held_replays():
            break
        seed = first_seed + len(answers)
        answers += generate(rig, [{"max_tokens": tokens, "seed": seed + i, "top_k": top_k}
                                  for i in range(WAVE)])
    return answers


def _settle(rig: Rig, case: Case, before: Samples, injected: int) -> Deltas:
    """Metrics after the row, once late frames have arrived (bounded wait)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        d = Deltas(before, rig.metrics("verifier"))
        if not case.expect(d, injected) or time.monotonic() > deadline:
            return d
        time.sleep(POLL_S)


def _observed(case: Case, d: Deltas) -> str:
    name, _, label = case.counter.partition("{")
    if not label:
        return str(d(f"{name}_total"))
    key = "cause" if name == "fallbacks" else "reason"  # fallbacks are labelled by cause
    return str(d(f"{name}_total", **{key: label.rstrip("}")}))


def _common(case: Case, d: Deltas, answers: list[dict], requests: int, tokens: int) -> list[str]:
    out = []
    short = [len(a["token_ids"]) for a in answers if len(a["token_ids"]) != tokens]
    if len(answers) != requests or short:
        out.append(f"{len(answers)} answers, lengths off: {short[:5]}")
    made = sum(a["stats"]["accepted"] + a["stats"]["rounds"] + a["stats"]["target_only_steps"]
               for a in answers)
    out += equal("generated_tokens (vs answers' rounds)", d("generated_tokens_total"), made)
    spec = d("rounds_total", kind="speculative")
    out += equal("verified rounds (vs answers)", spec,
                  sum(a["stats"]["rounds"] for a in answers))
    out += equal("drafted_tokens (depth x verified rounds)", d("drafted_tokens_total"),
                  DEPTH * spec)
    said = Counter()
    for a in answers:
        said.update(a["stats"]["fallbacks"])
    out += [f"fallbacks{{{c}}}: metrics {n}, answers {said[c]}"
            for c, n in d.fallbacks().items() if n != said[c]]
    out += equal("fallback steps (vs answers)", d("rounds_total", kind="fallback"),
                  sum(said.values()))
    return out


# -- printing ----------------------------------------------------------------------

COLUMNS = ("fault", "injected", "counter that must equal it", "observed", "requests complete",
           "fallbacks by cause", "wire audit", "result")


def format_table(rows: list[RowResult]) -> str:
    """The matrix as a Markdown table (what RELIABILITY.md records)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        falls = ", ".join(f"{k} {v}" for k, v in sorted(r.fallbacks.items())) or "none"
        result = "PASS" if r.ok else "FAIL: " + "; ".join(r.problems)[:200]
        cells = (r.name, str(r.injected), r.counter, r.observed, f"{r.complete}/{r.requests}",
                 falls, r.audit, result)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
