"""A round through the sans-IO endpoints alone, in one process: the floor that the
Python of the core sets under a round, whatever the transport.

The daemons' round (pp1q.tools.bench.round: 4 requests x depth 5 at V = 129280, or
``requests`` of them; the same canned rows, configurations, checker and decision path)
with no socket, no event loop and no second process: a VerifierEndpoint and a
WorkerEndpoint here, the round's bytes handed from one to the other. Each round is timed
phase by phase, in the order a round of the daemons runs them:

- ``steps``: the verifier frames the last round's COMMITs and this round's STEPs;
- ``read_steps``: the worker decodes and checks them;
- ``rows``: the worker frames its rows (sparse: a PROPOSAL a request; dense: a REPLY
  a row from reused rows, as the drafter frames them, and a COMPLETION a request);
- ``read_rows``: the verifier decodes and checks them, fed as a socket feeds it
  (get_buffer / buffer_updated; the copy into its buffer stands in for recv_into's);
- ``decide``: the service's decision for the round (KernelRounds), canned target rows.

``floor`` is ``steps + read_steps + max(rows, read_rows)``: the daemons overlap the
worker framing a request's rows with the verifier checking the previous request's, so
no round of theirs on this machine can take less, however cheap its transport (dense
rows up to one difference: the stand-in copy reads what the join just wrote, 80-100 us
a 517 KB row on the reference machine, the kernel's recv_into ~60 us in the daemons).
Against the raw round of the same bytes it says how much of a round goal the core's
Python leaves to everything else (``pp1q bench goals`` prints it under each round goal).

The helpers a bench round's two runs share live here too (``round_steps``,
``target_rows``, ``decide_round``, ``commit_round``): the daemons' round
(pp1q.tools.bench.round) sends, decides and commits with the same ones.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from pp1q.tools.bench.round_peer import DEPTH, REQUESTS, TOP_K, VOCAB, canned_rows
from pp1q.tools.bench.wire import _feed_recv_into

PHASES = ("steps", "read_steps", "rows", "read_rows", "decide")


def target_rows() -> list[np.ndarray]:
    """Each request's canned target p, [DEPTH + 1, VOCAB] float64 (fixed seed): the rows a
    bench round decides against (model compute is not timed)."""
    from pp1q.models.toy import softmax64

    rng = np.random.default_rng(7)
    return [softmax64(rng.normal(size=(DEPTH + 1, VOCAB)) * 3.0) for _ in range(REQUESTS)]


def round_steps(session: int, prefixes: dict, round_id: int, top_k: int) -> list:
    """A bench round's STEPs: one a slot of ``prefixes`` (slot -> its committed Prefix),
    drafting from the position after it."""
    from pp1q.wire import Step

    return [Step(session=session, slot=s, generation=1, round_id=round_id,
                 last_committed=p.last_position, first_position=p.last_position + 1,
                 prefix_digest=p.digest, depth=DEPTH, temperature=1.0, top_k=top_k,
                 context_version=0, seed=s) for s, p in prefixes.items()]


def decide_round(kernel, p: list, steps: list, ready: list) -> list:
    """The service's decision (``kernel``: KernelRounds) for a round's ``steps`` and
    their ProposalReady events, against the canned target rows ``p`` (target_rows)."""
    from pp1q.core.verify import RoundKeys

    return kernel.sampled([p[st.slot % REQUESTS] for st in steps],
                          [pr.q_rows for pr in ready],
                          [list(pr.draft_ids) for pr in ready],
                          [RoundKeys(st.seed, 1, st.round_id, st.first_position) for st in steps])


def commit_round(steps: list, decided: list, ready: list, prefixes: dict) -> list:
    """The COMMITs of a decided round, each slot's prefix in ``prefixes`` extended by
    what it commits (the worker extends its own copy as it reads them)."""
    from pp1q.wire import Commit

    out = []
    for st, d, pr in zip(steps, decided, ready, strict=True):
        out.append(Commit(session=st.session, slot=st.slot, generation=1, round_id=st.round_id,
                          accepted=d.accepted, token=d.token,
                          committed=st.last_committed + d.accepted + 1))
        prefixes[st.slot].extend([*pr.draft_ids[:d.accepted], d.token])
    return out


class _CoreRound:
    """Both endpoints past their handshake, each slot's context sent: ready for rounds.
    ``requests``: slots, one request each (the canned rows and target rows of request
    ``slot % REQUESTS``: more requests scale the work, not the data)."""

    def __init__(self, form: str, requests: int = REQUESTS) -> None:
        from pp1q.core.prefix import Prefix
        from pp1q.models.toy import ToySpec
        from pp1q.verifier.kernel_rounds import KernelRounds
        from pp1q.verifier.steps_in_flight import slot_buffers
        from pp1q.wire import VerifierEndpoint, WorkerEndpoint, context_of
        from pp1q.wire.pool import ZeroRows
        from pp1q.wire.session_config import DEFAULT_MAX_SUPPORT, verifier_config, worker_config

        spec = ToySpec(vocab=VOCAB)
        self.form = form
        self.top_k = 0 if form == "dense" else TOP_K
        self.requests = requests
        config = verifier_config(spec, (2,), requests, DEPTH, DEFAULT_MAX_SUPPORT)
        # payload buffers made once, as the verifier's link makes them
        self.v = VerifierEndpoint(config, session=1, pool=slot_buffers(config.limits))
        # the worker daemon's default: no self-check of outgoing rows (the verifier's do)
        self.w = WorkerEndpoint(worker_config(spec, (2,), DEFAULT_MAX_SUPPORT),
                                check_outgoing=False)
        self.w.receive_data(self.v.hello(), 0.0)
        self.v.receive_data(self.w.data_to_send(), 0.0)
        self.canned = canned_rows(form)
        self.prefixes = {s: Prefix(range(11)) for s in range(requests)}  # positions 0..10
        self.w.receive_data(b"".join(
            self.v.send(context_of(session=self.v.session, slot=s, generation=1,
                                   tokens=p.tokens, digest=p.digest))
            for s, p in self.prefixes.items()), 0.0)
        self.p = target_rows()
        self.kernel = KernelRounds()
        self.dense_rows = ZeroRows()
        self.commits: list = []
        self.round_id = 0

    def round(self) -> dict[str, float]:
        """One round; seconds per phase."""
        from pp1q.wire import ProposalReady, StepRefused

        self.round_id = r = self.round_id + 1
        v, w = self.v, self.w
        t0 = time.perf_counter()
        steps = round_steps(v.session, self.prefixes, r, self.top_k)
        to_worker = b"".join([v.send(c) for c in self.commits]
                             + [v.send(st, 0.0) for st in steps])
        t1 = time.perf_counter()
        refused = [e for e in w.receive_data(to_worker, 0.0) if isinstance(e, StepRefused)]
        t2 = time.perf_counter()
        if refused:  # the worker's context and ours differ: nothing below could run
            raise RuntimeError(f"core round {r}: the worker refused {refused!r}")
        parts = [part for st in steps for part in self._frames(st)]
        t3 = time.perf_counter()
        stream = b"".join(parts)  # untimed: the kernel's send copy in the daemons
        t4 = time.perf_counter()
        ready = [e for e in _feed_recv_into(v, stream) if isinstance(e, ProposalReady)]
        t5 = time.perf_counter()
        if len(ready) != self.requests:
            raise RuntimeError(f"core round {r} did not validate: {ready!r}")
        decided = decide_round(self.kernel, self.p, steps, ready)
        t6 = time.perf_counter()
        self.commits = commit_round(steps, decided, ready, self.prefixes)  # sent next round
        return dict(zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t5 - t4, t6 - t5), strict=True))

    def _frames(self, step) -> list:
        """The worker's frames for ``step``, as its drafter frames them."""
        from pp1q.wire import Form

        chain = self.canned[step.slot % REQUESTS][:step.depth]
        w = self.w
        if self.form != "dense":
            return [w.send_proposal(step, [t for t, _ in chain], [row for _, row in chain])]
        out = []
        for index, (token, row) in enumerate(chain, start=1):
            # drained: nothing is held by a transport here, every row is free again
            out += w.send_row(step, index, token, row, Form.DENSE, self.dense_rows.take(True))
        out.append(w.send_completion(step.slot))
        return out


def time_core(form: str, rounds: int, requests: int = REQUESTS) -> dict[str, float]:
    """Median ms per round of each phase (PHASES), after a warm-up of a tenth of the
    rounds (at least 2); ``floor``: steps + read_steps + max(rows, read_rows) of those
    medians; ``requests``: a round's requests (slots)."""
    core = _CoreRound(form, requests)
    for _ in range(max(2, rounds // 10)):
        core.round()
    times = [core.round() for _ in range(rounds)]
    out = {name: statistics.median(t[name] for t in times) * 1e3 for name in PHASES}
    out["floor"] = (out["steps"] + out["read_steps"]
                    + max(out["rows"], out["read_rows"]))
    return out


def describe(t: dict[str, float], raw_ms: float) -> str:
    """One line: the floor against ``raw_ms`` (the raw round of the same run) and the
    phases it is made of."""
    return (f"  (the sans-IO core alone, in process: floor {t['floor']:.2f} ms = "
            f"{t['floor'] / raw_ms:.2f}x raw; verifier frames COMMITs + STEPs "
            f"{t['steps']:.2f}, worker reads them {t['read_steps']:.2f}, worker frames rows "
            f"{t['rows']:.2f}, verifier reads and checks them {t['read_rows']:.2f}; "
            f"decision {t['decide']:.2f} ms)")


def per_request_by_batch(rounds: int, form: str = "sparse") -> str:
    """One line: each phase in us a request, at REQUESTS and at 64 requests a round (the
    daemons' most slots). A cost that grows with the batch shows here: until 2 Dec 2026
    the max_inflight check counted every slot for every STEP, and a 64-step round cost
    0.75 ms to frame (0.42 since)."""
    cells = []
    for n in (REQUESTS, 64):
        t = time_core(form, rounds, n)
        cells.append(f"{n} requests " + " / ".join(f"{t[k] / n * 1e3:.0f}" for k in PHASES))
    return (f"{form}, the core alone in process, us a request ({' / '.join(PHASES)}): "
            + "; ".join(cells))


def describe_one_process(ours: float, full: float, t: dict[str, float]) -> str:
    """One line: the round with both adapters on one event loop in one process (``ours``,
    ``full``: pp1q.tools.bench.round.time_one_process) against ``t``, the core's phases
    (time_core) summed: what the adapters and their syscalls cost a round."""
    core = sum(t[k] for k in PHASES if k != "decide")
    return (f"sparse, both adapters on one event loop in one process (nothing overlaps): "
            f"{ours:.3f} ms a round (+verify {full:.3f}); the core's four phases summed "
            f"{core:.3f} ms: the adapters and their syscalls {ours - core:.3f} ms")
