"""The chaos matrix's distribution row: exactness under a mix of random frame faults.

Many short requests (prompt [3, 7], DIST_TOKENS new tokens, seeds 1..N) run against the
matrix pair while every frame a proposal travels in may take a random, content-blind
fault of every kind that keeps the session (``mixed_rules``); the token counts go to a
``judge`` (the tests' goodness-of-fit test against the exact target marginals). With ``top_k``
the requests ask a sparse proposal support: at the matrix's vocabulary 16 a top-3 step
of depth 5 fits one PROPOSAL (5 x 3 x 8 = 120 payload bytes of the 128 a vocab-16
session allows a frame), so the faults hit PROPOSAL frames instead of REPLY rows. The
request's top_k shapes only q: the target, hence the exact marginals, are the same.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pp1q.tools.chaos.faults import FaultKind, Rule, random_frame_rules
from pp1q.tools.chaos.matrix import DEPTH, POLL_S, SETTLE_S, Deltas, equal, generate
from pp1q.tools.chaos.rig import Rig

DIST_TOKENS = 3  # per request in the distribution row (prompt [3, 7], vocab 16)
DIST_FAULT_P = 0.01  # per frame and kind: about a quarter of proposals take a fault, so
# most tokens still come from verified rounds and the judge keeps its power
SPARSE_DIST_TOP_K = 3  # the largest top-k whose depth-5 PROPOSAL fits a vocab-16 session

Judge = Callable[[np.ndarray], tuple[bool, str]]


def mixed_rules(seed: int, watchdog_s: float, p: float = DIST_FAULT_P) -> list[Rule]:
    """Random, content-blind frame faults of every kind that keeps the session (seeded;
    faults.random_frame_rules): ``p`` per REPLY row and kind, ``DEPTH`` x ``p`` per
    PROPOSAL and kind (the same chance per proposal), ``p / 4`` for each kind that
    stalls a request for a whole watchdog. Disconnects are left to their own row: each
    one sends every request target-only until the session is back, which would leave
    little speculation to check."""
    return random_frame_rules(random.Random(seed), watchdog_s, row_p=p, stall_p=p / 4,
                              proposal_p=DEPTH * p)


@dataclass
class DistributionResult:
    requests: int
    complete: int
    injected: dict[str, int]
    fallbacks: dict[str, int]
    violations: int
    verified_rounds: int  # tokens came from these verified proposals...
    target_only_steps: int  # ...and from these fallback steps
    verdict: str
    fits: bool  # the judge's verdict alone
    ok: bool  # fits, every request complete, no audit violation, some fault injected,
    # and (sparse) every commit by PROPOSAL, no accounting problem
    commits: int = 0  # COMMITs the wire audit checked...
    proposal_commits: int = 0  # ...of them, proposals that came as one PROPOSAL frame
    top_k: int | None = None  # the requests' proposal support (None: dense q)
    problems: list[str] = field(default_factory=list)  # the PROPOSAL accounting's


def proposal_accounting(d: Deltas, injected: dict[str, int], fired: Counter) -> list[str]:
    """When every proposal is one PROPOSAL frame, each fault on it ends exactly one way
    (sparse_rows.py): a bit flip or a truncation in one invalid_reply fallback; a drop,
    a delay or a reorder (``fired``: a reordered frame is counted as injected only once
    a later frame released it) in one watchdog timeout; a duplicated or replayed copy
    in one discarded late frame, as the delayed and reordered frames that arrived before
    the end are (so the late frames lie between the copies and all of them), and only
    a duplicated one as duplicate_round."""
    k = FaultKind
    corrupt = injected.get(k.BIT_FLIP, 0) + injected.get(k.TRUNCATE, 0)
    stalls = fired[k.DROP] + fired[k.DELAY] + fired[k.REORDER]
    copies = injected.get(k.DUPLICATE, 0) + injected.get(k.REPLAY, 0)
    late = d.total("late_replies_discarded_total")
    # only a copy of a live generation's finished round is discarded as a duplicate: a
    # replayed, delayed or reordered frame comes once its generation is dead
    duplicates = d("late_replies_discarded_total", reason="duplicate_round")
    out = (equal("fallbacks{invalid_reply} (bit flips + truncations)",
                 d("fallbacks_total", cause="invalid_reply"), corrupt)
           + equal("watchdog_timeouts (drops + delays + reorders)",
                   d("watchdog_timeouts_total"), stalls)
           + equal("fallbacks{watchdog_timeout}", d("fallbacks_total", cause="watchdog_timeout"),
                   stalls)
           + equal("fallbacks (other causes)", sum(d.fallbacks().values()), corrupt + stalls))
    most = copies + injected.get(k.DELAY, 0) + injected.get(k.REORDER, 0)
    if not copies <= late <= most:
        out.append(f"late frames discarded {late}, want {copies}..{most}")
    if duplicates > injected.get(k.DUPLICATE, 0):
        out.append(f"late frames discarded as duplicate_round {duplicates}, more than the "
                   f"{injected.get(k.DUPLICATE, 0)} duplicates")
    return out


def run_distribution(rig: Rig, requests: int, judge: Judge | None, *, seed: int = 1,
                     watchdog_s: float = 0.3, rules: list[Rule] | None = None,
                     top_k: int | None = None) -> DistributionResult:
    """``requests`` requests of DIST_TOKENS tokens (seeds 1..N; q dense, or sparse top
    ``top_k``) under ``rules`` (default: ``mixed_rules``); ``judge(counts[DIST_TOKENS,
    vocab])`` says whether the output fits the target."""
    inj0 = Counter(rig.proxy.injections)
    audit = rig.audit
    a0 = (len(audit.violations), audit.commits, audit.proposal_commits)
    before = rig.metrics("verifier")
    rules = mixed_rules(seed, watchdog_s) if rules is None else rules
    rig.proxy.set_rules(rules)
    try:
        answers = generate(rig, [{"max_tokens": DIST_TOKENS, "seed": i + 1, "top_k": top_k}
                                 for i in range(requests)])
    finally:
        rig.proxy.set_rules([])
    injected, fired = _injections(rig, inj0, rules)
    deadline = time.monotonic() + SETTLE_S  # delayed frames land, their discards counted
    while True:
        landed = not rig.proxy.delayed()  # asked first: what landed is in the scrape below
        d = Deltas(before, rig.metrics("verifier"))
        problems = [] if top_k is None else proposal_accounting(d, injected, fired)
        if (landed and not problems) or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
        injected, fired = _injections(rig, inj0, rules)
    counts = np.zeros((DIST_TOKENS, rig.vocab), dtype=np.int64)
    complete = 0
    for a in answers:
        if len(a["token_ids"]) == DIST_TOKENS:
            complete += 1
            for pos, t in enumerate(a["token_ids"]):
                counts[pos, t] += 1
    ok, verdict = judge(counts) if judge is not None else (True, "not judged")
    violations = len(audit.violations) - a0[0]
    fallbacks = {k: v for k, v in d.fallbacks().items() if v}
    commits, by_proposal = audit.commits - a0[1], audit.proposal_commits - a0[2]
    if top_k is not None and not by_proposal == commits > 0:
        problems.append(f"{by_proposal} of {commits} commits by PROPOSAL")
    all_ok = (ok and complete == requests and not violations and sum(injected.values()) > 0
              and not problems)
    rounds = sum(a["stats"]["rounds"] for a in answers)
    target_only = sum(a["stats"]["target_only_steps"] for a in answers)
    return DistributionResult(requests, complete, injected, fallbacks, violations, rounds,
                              target_only, verdict, ok, all_ok, commits, by_proposal, top_k,
                              problems)


def _injections(rig: Rig, inj0: Counter, rules: list[Rule]) -> tuple[dict[str, int], Counter]:
    """(injections by kind since ``inj0``, firings of ``rules`` by kind)."""
    injected = {k.value: v - inj0[k] for k, v in rig.proxy.injections.items() if v - inj0[k]}
    fired = Counter()
    for r in rules:
        fired[r.fault.kind] += r.fired
    return injected, fired


def format_distribution(d: DistributionResult) -> str:
    def kv(x: dict) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(x.items())) or "none"
    q = "dense q" if d.top_k is None else \
        f"top-{d.top_k} q, {d.proposal_commits} of {d.commits} commits by PROPOSAL"
    return (f"distribution under mixed faults ({q}): {d.complete}/{d.requests} requests "
            f"complete; injected {kv(d.injected)}; fallbacks {kv(d.fallbacks)}; "
            f"{d.verified_rounds} verified rounds, {d.target_only_steps} target-only steps; "
            f"audit violations {d.violations}; {d.verdict}; {'PASS' if d.ok else 'FAIL'}"
            + "".join(f"; {p}" for p in d.problems))
