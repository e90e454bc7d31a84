"""Per-round overhead of the daemons' transport, side by side with raw sockets and ZMQ.

One round = 4 requests x depth 5 at vocabulary 129280: 4 STEPs out; back, dense: 20
REPLY frames (FP32 q) and 4 COMPLETIONs; sparse (top-32): 4 PROPOSAL frames (wire v2
revision 3: a step's rows and totals in one frame). Every column sends the same row
bytes, grouped alike, over loopback TCP to this process from a child process, one round
of each in turn (``time_side_by_side``: every peer idle between its rounds, as a worker
is during the target's forward, and the machine's drifting load shared alike):

- raw: blocking sockets, header and payload in one sendmsg per frame, recv_into one
  preallocated buffer (the physical floor for these bytes through the kernel);
- zmq: pyzmq PAIR sockets, multipart (msgspec header, payload arrays), zero-copy
  receive and msgspec decode (the vLLM engine-core style); skipped without pyzmq;
- loop: raw's frames through uvloop protocols on both ends and nothing else (no wire
  core, no task: pp1q.tools.bench.loop_client): what an event loop costs a round alone;
- ours: the daemons' adapters (WorkerConnection -> WorkerLink, uvloop, BufferedProtocol),
  every row validated (dyadic counts, support, checksums, COMPLETION totals); "+verify"
  adds standard verification of the 4 requests (the service's decision path: one
  pp1q_kernels call for the round, pp1q.verifier.kernel_rounds) against precomputed
  target rows and the COMMITs. Model compute is excluded on both sides (canned q rows,
  canned target p). "two batches" runs 8 requests as two batches of 4 at once, as the
  design sizes the link (two STEP batches in flight): while the verifier decides and
  commits one batch, the worker drafts the other's rows; timed per batch-round in a
  block of its own, against raw rounds timed back to back (a blocking raw round between
  its rounds would stall the other batch).

Then tokens/s of the toy demo pair (V = 129280, real daemon processes, target forward 0
and 50 ms), speculative vs target-only.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable

from pp1q.tools.bench.loop_client import LoopClient
from pp1q.tools.bench.peer_clients import RawClient, ZmqClient, median_ms, time_raw, zmq_missing
from pp1q.tools.bench.round_peer import DEPTH, REQUESTS, TOP_K, VOCAB, Peer, ours_server

TITLE = ("Daemons: round overhead, 4 requests x depth 5 at V=129280, vs raw loopback, "
         "uvloop alone and pyzmq+msgspec (same bytes, same run); demo pair tokens/s")


def time_side_by_side(form: str, rounds: int, checker: str | None = None,
                      with_zmq: bool = False, check_outgoing: bool = False,
                      with_loop: bool = False) -> dict[str, float]:
    """Median ms per round of raw sockets (and pyzmq: ``with_zmq``, where installed; the
    same frames through uvloop on both ends with no wire core: ``with_loop``), ours and
    ours + verification and COMMIT ("raw", "zmq", "loop", "ours", "full"), one round of
    each in turn: before every round of ours, one raw round (and one of the others), each
    on its own connection. Every peer is then idle between its rounds, as a worker is
    while the target runs its forward, and the machine's load, which drifts within
    seconds here, falls on all of them alike. ``time_raw`` instead times raw rounds back
    to back: a hot ping-pong whose peer never sleeps, a floor no service round meets.
    Also "ours_iqr" and "full_iqr": the quartiles of each round's ratio to the raw round
    just before it."""
    clients = {"raw": RawClient(form)}
    try:
        if with_zmq and not zmq_missing():
            clients["zmq"] = ZmqClient(form)
        if with_loop:
            clients["loop"] = LoopClient(form)
        times: dict[str, list[float]] = {name: [] for name in clients}

        def between() -> None:
            for name, client in clients.items():
                times[name].append(client.round())

        log: list[tuple[float, float]] = []
        ours, full = time_ours(form, rounds, check_outgoing, checker, between=between, log=log)
    finally:
        for client in clients.values():
            client.close()
    out = {name: median_ms(t[1:]) for name, t in times.items()}
    out.update(ours=ours, full=full)
    # each round of ours against the raw round just before it: how far the rounds spread
    pairs = list(zip(times["raw"], log, strict=True))[1:]
    for i, name in enumerate(("ours", "full")):
        q1, _, q3 = statistics.quantiles([o[i] / r for r, o in pairs], n=4)
        out[f"{name}_iqr"] = (q1, q3)
    return out


def time_ours(form: str, rounds: int, check_outgoing: bool = False,
              checker: str | None = None, decide: str | None = None,
              batches: int = 1, between: Callable[[], None] | None = None,
              log: list | None = None) -> tuple[float, float]:
    """(transport + validation, + verification and commit) median ms per round.
    ``check_outgoing``: the worker's own REPLY checks (off: the worker daemon's default).
    ``checker``: the q-row checker both ends use (pp1q.core.q_backend; None: this
    process's choice, PP1Q_VALIDATE or auto); ``decide``: the verifier's CPU decision
    path (pp1q_kernels.numba_rows: numba or torch; None: PP1Q_DECIDE or auto);
    ``batches``: batches of 4 requests in flight at once (see ``_ours``); ``between``:
    called before each round, untimed (one batch only: ``time_side_by_side``); ``log``:
    gets every round's (transport s, + verification s) of the first batch."""
    from pp1q.core import q_backend
    from pp1q_kernels import numba_rows

    before = q_backend.select(checker) if checker else None
    before_decide = numba_rows.select(decide) if decide else None
    peer = Peer("ours-checked" if check_outgoing else "ours", form, checker)
    try:
        return _run_warm(_ours(peer.port, form, rounds, batches, between, log))
    finally:
        peer.close()
        if before:
            q_backend.select(before)
        if before_decide:
            numba_rows.select(before_decide)


def time_one_process(form: str, rounds: int) -> tuple[float, float]:
    """``time_ours``' two figures with the worker's adapter served on this process's own
    event loop (round_peer's ``ours_server``): both adapters, nothing overlapping, no
    second process; against the core's phases summed, what the adapters cost a round."""

    async def main() -> tuple[float, float]:
        server = await ours_server(form)
        try:
            return await _ours(server.sockets[0].getsockname()[1], form, rounds)
        finally:
            server.close()

    return _run_warm(main())


def _run_warm(rounds):
    """``rounds`` on uvloop, the kernels loaded first (as the daemons load them at start)."""
    import uvloop

    from pp1q.core import q_backend
    from pp1q_kernels import numba_rows

    q_backend.warm_up()
    numba_rows.warm_up()
    return uvloop.run(rounds)


def time_ours_two_batches(form: str, rounds: int) -> float:
    """Median ms per batch-round with two batches of 4 requests in flight, as the
    design sizes the link (``steps_in_flight.MAX_BATCHES_IN_FLIGHT``): while the verifier decides
    and commits one batch, the worker drafts the other's rows on the other core.
    Verification and COMMIT included, both ends' default checkers and decision path."""
    return time_ours(form, rounds, batches=2)[1]


async def _ours(port: int, form: str, rounds: int, batches: int = 1,
                between: Callable[[], None] | None = None,
                log: list | None = None) -> tuple[float, float]:
    """(transport + validation, + verification and commit) median ms per round of one
    batch; with ``batches`` > 1 the batches run at once, each on its own slots, and the
    second figure is the whole run's ms per batch-round (the first is then per batch).
    ``between``: called before each round, outside its time (one batch only: with two,
    a blocking call would stall the other batch's round); ``log``: extended with every
    round's (transport s, + verification s) of the first batch."""
    if between is not None and batches != 1:
        raise ValueError("between runs only with one batch")
    from pp1q.models.toy import ToySpec
    from pp1q.runtime.metrics import Metrics
    from pp1q.tools.bench.core_round import target_rows
    from pp1q.verifier.kernel_rounds import KernelRounds
    from pp1q.verifier.link import Needs, WorkerLink
    from pp1q.wire.session_config import DEFAULT_MAX_SUPPORT, verifier_config

    slots = REQUESTS * batches
    config = verifier_config(ToySpec(vocab=VOCAB), (2,), slots, DEPTH, DEFAULT_MAX_SUPPORT)
    link = WorkerLink("127.0.0.1", port, config, Needs(slots, DEPTH, TOP_K),
                      Metrics("verifier"), step_timeout=10.0, reconnect_max_s=1.0)
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(link.run(stop))
    if not await link.wait_ready(30.0):
        raise RuntimeError("bench worker peer did not answer HELLO")
    p = target_rows()
    kernel = KernelRounds()  # the service's decision path, one call for a batch's requests
    t0 = time.perf_counter()
    timed = await asyncio.gather(*(
        _batch_rounds(link, range(b * REQUESTS, (b + 1) * REQUESTS), form, rounds, p, kernel,
                      between)
        for b in range(batches)))
    elapsed = time.perf_counter() - t0
    stop.set()
    await task
    wire_t, total_t = timed[0]
    if log is not None:
        log.extend(zip(wire_t, total_t, strict=True))
    if batches == 1:
        return median_ms(wire_t[1:]), median_ms(total_t[1:])
    return median_ms(wire_t[1:]), elapsed / (batches * rounds) * 1e3


async def _batch_rounds(link, slots: range, form: str, rounds: int, p: list, kernel,
                        between: Callable[[], None] | None = None,
                        ) -> tuple[list[float], list[float]]:
    """One batch's rounds on ``slots``: ([transport + validation s], [+ decision and
    COMMIT s]) per round; ``between()`` first, untimed, before each (the previous round's
    COMMITs are still queued then: they leave with the STEPs, as they do without it)."""
    from pp1q.core.prefix import Prefix
    from pp1q.tools.bench.core_round import commit_round, decide_round, round_steps

    top_k = 0 if form == "dense" else TOP_K
    prefixes = {s: Prefix(range(11)) for s in slots}  # committed: positions 0..10
    for slot, prefix in prefixes.items():  # a STEP needs its slot's context
        link.send_context(slot, 1, prefix, 0)
    wire_t, total_t = [], []
    for r in range(1, rounds + 1):
        steps = round_steps(link.session, prefixes, r, top_k)
        if between is not None:
            between()
        t0 = time.perf_counter()
        ready = await asyncio.gather(*(link.propose(st) for st in steps))
        t1 = time.perf_counter()
        if not all(hasattr(pr, "q_rows") for pr in ready):
            raise RuntimeError(f"bench round {r} fell back: {ready}")
        for commit in commit_round(steps, decide_round(kernel, p, steps, ready), ready,
                                   prefixes):
            link.commit(commit)
        t2 = time.perf_counter()
        wire_t.append(t1 - t0)
        total_t.append(t2 - t0)
    return wire_t, total_t


def demo_rates(quick: bool, target_delay_ms: float) -> tuple[float, float, float]:
    """(speculative tokens/s, target-only tokens/s, accepted drafts per round)."""
    from pp1q.runtime.launcher import demo_prompts, start_pair
    from pp1q.tools.client import run_batch

    requests, max_tokens = (4, 16) if quick else (16, 48)
    log_dir = tempfile.mkdtemp(prefix="pp1q-bench-")
    worker, verifier, url = start_pair(log_dir, vocab=VOCAB, target_delay_ms=target_delay_ms)
    try:
        prompts = demo_prompts(requests, VOCAB, 1)
        rates = []
        for speculative in (True, False):
            answers, seconds = run_batch(url, prompts, max_tokens, concurrency=REQUESTS,
                                         first_seed=1, options={"speculative": speculative})
            rates.append(sum(len(a["token_ids"]) for a in answers) / seconds)
            if speculative:
                rounds = sum(a["stats"]["rounds"] for a in answers)
                accepted = sum(a["stats"]["accepted"] for a in answers) / max(rounds, 1)
    finally:
        verifier.stop()
        worker.stop()
    return rates[0], rates[1], accepted


def run(quick: bool) -> list[str]:
    from pp1q.tools.bench.core_round import describe_one_process, per_request_by_batch, time_core
    from pp1q.tools.bench.wire import checkers

    lines = ["one round of raw, pyzmq, loop (uvloop alone) and ours in turn "
             "(time_side_by_side); ratios to the raw rounds of the same run",
             f"{'form':<7}{'raw ms':>9}{'zmq ms':>9}{'loop ms':>9}{'ours ms':>9}{'+verify':>9}"
             f"{'zmq/raw':>9}{'loop/raw':>9}{'ours/raw':>10}{'+verify/raw':>12}  self-check"
             f"  rows checked by"]
    for form in ("dense", "sparse"):
        rounds = (8 if quick else 40) if form == "dense" else (30 if quick else 300)
        for check in (True, False):
            for checker in checkers():  # both ends, worker and verifier
                t = time_side_by_side(form, rounds, checker, with_zmq=True, check_outgoing=check,
                                      with_loop=True)
                raw, zmq, loop = t["raw"], t.get("zmq"), t["loop"]
                zmq_ms = f"{zmq:9.3f}" if zmq is not None else f"{'n/a':>9}"
                zmq_ratio = f"{zmq / raw:9.2f}" if zmq is not None else f"{'n/a':>9}"
                lines.append(f"{form:<7}{raw:9.3f}{zmq_ms}{loop:9.3f}{t['ours']:9.3f}"
                             f"{t['full']:9.3f}{zmq_ratio}{loop / raw:9.2f}"
                             f"{t['ours'] / raw:10.2f}{t['full'] / raw:12.2f}  "
                             f"{'on' if check else 'off':<10}  {checker}")
        # back to back: raw's hot ping-pong, and the two batches (a block of their own)
        hot = time_raw(form, rounds)
        two = time_ours_two_batches(form, rounds)
        lines.append(f"{form:<7}back to back: raw {hot:.3f} ms; two batches in flight (the "
                     f"design's link): +verify {two:.3f} ms per batch-round = "
                     f"{two / hot:.2f}x that raw")
        if form == "sparse":  # the floor before revision 3, for the history's ratios
            rows = time_raw(form, rounds, per_row=True)
            lines.append(f"{form:<7}raw sockets sending a frame a row (revision 2's framing, "
                         f"24 frames), back to back: {rows:.3f} ms")
    lines.append(per_request_by_batch(20 if quick else 100))
    lines.append(describe_one_process(*time_one_process("sparse", 30 if quick else 300),
                                      time_core("sparse", 20 if quick else 100)))
    if zmq_missing():
        lines.append("zmq: pyzmq not installed (pip install pyzmq) -- column skipped")
    lines.append("medians per round; 'ours' = transport + validation, '+verify' adds "
                 "standard verification and COMMIT (model compute excluded); two batches: "
                 "8 requests on their own slots, the run's time per batch-round")
    for delay in (0.0, 50.0):
        spec, base, acc = demo_rates(quick, delay)
        lines.append(f"demo pair, target forward {delay:g} ms: speculative {spec:7.1f} tokens/s, "
                     f"target-only {base:7.1f} tokens/s (x{spec / base:.2f}), "
                     f"{acc:.2f} accepted drafts/round")
    return lines
