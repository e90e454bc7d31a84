"""After the soak's load: does speculation still work?

A STEP whose request left mid-round and that no event ended held its place among the
worker link's in-flight STEP batches (``MAX_BATCHES_IN_FLIGHT``, two) for ever (fixed in
d71bff0), and two such left every speculative request waiting, its slot held and no
counter moving, while target-only ones were still served. The check is behavioural:
with the faults stopped, short speculative requests until one round counts as
speculative (``pp1q_rounds_total{kind="speculative"}`` grows). A request that takes
``hang_s`` is the failure; one served target-only meanwhile (the circuit breaker still
open after the faults, up to ``breaker_open_max_s``) is not, and the next is sent. At
the end ``pp1q_steps_in_flight`` (the places held) must come back to 0, no request
running.

Under the soak's full load such a place heals: the slot is reused at once and its next
STEP, sent in the other place, ends the dead one (``WorkerLink._resolve`` clears a slot
from every batch); only two dead places at once, before either slot's reuse, hang
speculation, which takes a second cancel in flight within that moment. When traffic
ebbs nothing reuses the slot. So before the probe, with the faults stopped and the load
gone, ``LEAVING_CLIENTS`` streamed speculative requests are left one after another, each
just after its first event (the next round's STEP is out then, most of the time), the
ebb where the bug above hung every speculative request. ``check`` probes first too, so
the clients leave while speculation is served (the breaker closed again), not while an
open breaker sends no STEP to hold a place.
"""

from __future__ import annotations

import time
from collections import Counter

from pp1q.runtime.settings import VerifierSettings
from pp1q.tools.chaos import leave
from pp1q.tools.chaos.rig import Rig, value
from pp1q.tools.client import ApiError, Client

# the breaker's longest open period (the rig runs the verifier's defaults), then a margin
PROBE_DEADLINE_S = VerifierSettings().breaker_open_max_s + 10.0
PROBE_GAP_S = 0.25  # between probe requests: a target-only answer while the breaker is open
PROBE_PROMPT = (1, 2, 3)  # modulo the vocabulary
PROBE_TOKENS = 8  # a couple of rounds
LEAVING_CLIENTS = 8  # left mid-round one by one: two dead places among them hang the link
LEAVING_TOKENS = 32  # rounds after the first event: the client leaves mid-request
PLACES_FREE_S = 5.0  # a request's last outcome frees its place before its answer: margin


def _prompt(rig: Rig) -> list[int]:
    return [t % rig.vocab for t in PROBE_PROMPT]


def speculative_rounds(rig: Rig) -> float:
    return value(rig.metrics("verifier"), "pp1q_rounds_total", kind="speculative")


def probe_speculation(rig: Rig, hang_s: float,
                      deadline_s: float = PROBE_DEADLINE_S) -> tuple[str, float]:
    """('', seconds to the first speculative round) or (the problem, seconds spent)."""
    t0 = time.monotonic()
    before = speculative_rounds(rig)
    client = Client(rig.url, timeout=hang_s)
    try:
        for seed in range(1 << 30):
            t = time.monotonic()
            try:
                client.generate(_prompt(rig), PROBE_TOKENS, seed=seed, speculative=True)
            except ApiError as e:
                took = time.monotonic() - t
                if took >= hang_s:
                    return (f"a speculative request after the load hung ({took:.0f} s): "
                            f"speculation no longer served ({e})", time.monotonic() - t0)
                return f"a speculative request after the load failed: {e}", \
                    time.monotonic() - t0
            if speculative_rounds(rig) > before:
                return "", time.monotonic() - t0
            if time.monotonic() - t0 > deadline_s:
                break
            time.sleep(PROBE_GAP_S)
    finally:
        client.close()
    return (f"no speculative round within {deadline_s:g} s after the load "
            f"(target-only answers only)", time.monotonic() - t0)


def leave_one_by_one(rig: Rig, hang_s: float, count: int = LEAVING_CLIENTS
                     ) -> tuple[Counter[str], str]:
    """``count`` streamed speculative requests, each left after its first event, one
    after another: (stages they left at, '' or the problem: one that hung)."""
    stages: Counter[str] = Counter()
    host, port = rig.url.removeprefix("http://").rsplit(":", 1)
    plan = leave.Plan(streamed=True, speculative=True, wait_s=0.0, events=1)
    for seed in range(count):
        path, body = leave.body_of(plan, _prompt(rig), LEAVING_TOKENS, seed, None)
        try:
            stages[leave.leave(host, int(port), plan, path, body, hang_s)] += 1
        except leave.HungError as e:
            return stages, (f"a speculative stream after the load hung, after "
                            f"{sum(stages.values())} left one by one: {e}")
    return stages, ""


def check(rig: Rig, hang_s: float) -> tuple[Counter[str], str, float]:
    """Probe, leave one by one, probe again: (stages the clients left at, '' or the
    problem, seconds the last probe took to a speculative round)."""
    problem, took = probe_speculation(rig, hang_s)
    if problem:
        return Counter(), f"before the clients left: {problem}", took
    stages, problem = leave_one_by_one(rig, hang_s)
    if problem:
        return stages, problem, 0.0
    problem, took = probe_speculation(rig, hang_s)
    if not problem:
        problem = _no_place_held(rig)
    return stages, problem, took


def _no_place_held(rig: Rig) -> str:
    """With no request running, no STEP holds a place in flight (pp1q_steps_in_flight):
    a place leaked shows here even while the other place still serves."""
    deadline = time.monotonic() + PLACES_FREE_S
    while (held := value(rig.metrics("verifier"), "pp1q_steps_in_flight")) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    return f"{held:g} STEPs still in flight with no request running" if held else ""
