"""``pp1q bench profile``: one real-model verifier round, stage by stage, in process.

Issue 13's real-model goal: the verifier's per-round work other than the target's
forward <= 10% of that forward. This suite runs rounds of the embedded SmolLM2-135M
(vocabulary 49152) with the early-exit drafter (the daemons' default k = 28), depth 5,
through the production pieces, and times each verifier stage of every round:

  framing    STEP and COMMIT encoded, the worker's frames decoded by the
             VerifierEndpoint (one feed), less the row checks below: a sparse step that
             fits one frame as its PROPOSAL (as the worker daemon sends it,
             wire.sizes.proposal_fits), a dense one as REPLY frames and a COMPLETION
  q checks   the row checks inside that decode (pp1q.wire.validate: check_proposal for
             a PROPOSAL, check_reply a REPLY)
  q decode   the scheduler's re-derivation of every draft from its q
             (rounds.proposal_matches: one keyed draw and one sample a row; a
             dense row is sampled on its FP32 payload in place)
  forward    the model's forward inside HFTarget.score (CausalLM.forward)
  cache      the rest of HFTarget.score (rebuilding the request's cache, slicing the
             grown one back out) plus HFTarget.commit (the rollback)
  p          the request's processors on the round's logits (engine_decider.round_p)
  decision   standard verification (EngineDecider.verify_proposal: pp1q_kernels)

After each measured round, a target-only step from the same prefix (one-row forward,
p, the TARGET_ONLY pick; rolled back) is timed too, for issue 11's figure: what a round
costs the verifier against the step it replaces.

The worker's side runs in the same process, untimed: a WorkerEndpoint, the
EngineProposer over HFDrafter (the daemon's drafting path), its frames framed as the
daemon frames them. Probes split composite calls: ``check_proposal`` and
``check_reply`` as the VerifierEndpoint module sees them, and the target's
CausalLM.forward, each wrapped with a clock for the run and restored after; nothing
else is replaced.

The model runs on CUDA where there is a GPU (as ``pp1q bench kernels`` does;
scripts/device_check.sh runs this suite there), else on the CPU. A GPU runs behind its
caller, so there every clock read waits for the device first (``torch.cuda.synchronize``):
a stage is charged for the device work it queued, not the next stage that waits for it.
The process is pinned to one core (the last it may use) with one torch thread and
OMP_WAIT_POLICY=PASSIVE (pp1q.cli.bench sets it before torch loads), as a verifier
daemon runs on the two-core machine; affinity and threads are restored afterwards.
Medians over the measured rounds; rounds accept different numbers of drafts (the
decision reads more rows when more are accepted), so the accepted counts are printed.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

from pp1q.tools.bench import bench_device, device_clock, no_wait

K = 28  # early exit at 28 of 30 layers: the daemons' and the demo's default drafter
DEPTH = 5
TOP_K = 32  # the sparse case's q support (the design's initial bounded candidate)
ROUNDS, QUICK_ROUNDS = 16, 3
WARMUP_ROUNDS = 2  # first-call allocations and lazy imports, not measured
PROMPT = "Write a short story about a lighthouse keeper."
SEED = 1000
GOAL = 0.10  # issue 13: non-forward work <= 10% of the forward
# (q form, draft top-k, temperature, target top-p): the brief's four cases
CASES = (("dense", None, 1.0, None), ("dense", None, 0.7, 0.9),
         ("sparse", TOP_K, 1.0, None), ("sparse", TOP_K, 0.7, 0.9))
STAGES = ("framing", "q checks", "q decode", "forward", "cache", "p", "decision")

TITLE = (f"Real model: one verifier round stage by stage (SmolLM2-135M, early exit "
         f"k={K}, depth {DEPTH}, in process, one core)")


class _Clock:
    """Seconds spent inside a wrapped callable since the last ``take`` (and its calls);
    ``sync`` waits for the device before each clock read."""

    def __init__(self, fn, sync=no_wait) -> None:
        self.fn, self.spent, self.calls, self.sync = fn, 0.0, 0, sync

    def __call__(self, *args, **kwargs):
        self.calls += 1
        self.sync()
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.sync()
            self.spent += time.perf_counter() - t0

    def take(self) -> float:
        spent, self.spent = self.spent, 0.0
        return spent


@contextlib.contextmanager
def _pinned() -> Iterator[str]:
    """One core, one torch thread, for the block; what was done, in words."""
    import torch

    threads = torch.get_num_threads()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    torch.set_num_threads(1)
    try:
        if cpus:
            os.sched_setaffinity(0, {cpus[-1]})
        yield (f"pinned to core {cpus[-1]}" if cpus else "not pinned (no affinity here)") + \
            f", torch threads 1, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"
    finally:
        torch.set_num_threads(threads)
        if cpus:
            os.sched_setaffinity(0, set(cpus))


@contextlib.contextmanager
def probes(target) -> Iterator[dict[str, _Clock]]:
    """Clocks on ``check_reply`` and ``check_proposal`` (as the VerifierEndpoint module
    calls them) and on the target's model forward, for the block; the originals are
    back after it. Each clock waits for the target's device before it reads."""
    from pp1q.wire import verifier_endpoint

    sync = device_clock(target.device)
    clocks = {"check": _Clock(verifier_endpoint.check_reply, sync),
              "check_proposal": _Clock(verifier_endpoint.check_proposal, sync),
              "forward": _Clock(target.lm.forward, sync)}
    verifier_endpoint.check_reply = clocks["check"]
    verifier_endpoint.check_proposal = clocks["check_proposal"]
    target.lm.forward = clocks["forward"]
    try:
        yield clocks
    finally:
        verifier_endpoint.check_reply = clocks["check"].fn
        verifier_endpoint.check_proposal = clocks["check_proposal"].fn
        del target.lm.forward  # the instance attribute: the class's method again


@dataclass
class _Pair:
    """Both ends of one request: the worker's endpoint and proposer, the verifier's
    endpoint and decider over the target, and the request's committed prefix."""

    worker: object
    proposer: object
    verifier: object
    decider: object
    target: object
    prefix: object
    processors: object
    temperature: float
    top_k: int | None
    round_id: int = 0
    sync: object = no_wait  # device_clock of the target's device

    def now(self) -> float:
        """The clock, once the target's device has done what was queued on it."""
        self.sync()
        return time.perf_counter()


def _config(vocab: int):
    from pp1q.core.q import SEMANTIC_ID
    from pp1q.core.rng import RNG_ABI_ID
    from pp1q.wire import Identity, Limits, WireConfig

    ident = Identity(q_semantic_id=SEMANTIC_ID, verifier_id="standard-v1", vocab=vocab,
                     id_map_hash="bench", draft_id="bench", draft_adapted=False,
                     target_id="bench", rng_abi=RNG_ABI_ID, precision="fp32-le")
    return WireConfig(identity=ident, limits=Limits.make(vocab=vocab, max_slots=1),
                      versions=(2,))


def open_pair(ckpt, drafter, target, prompt: list[int], case) -> _Pair:
    from pp1q.core.drawkey import DrawKeys
    from pp1q.core.prefix import Prefix
    from pp1q.models.processors import normalised
    from pp1q.verifier.engine_decider import EngineDecider
    from pp1q.wire import PayloadPool, VerifierEndpoint, WorkerEndpoint, context_of
    from pp1q.worker.engine_proposer import EngineProposer

    _, top_k, temperature, top_p = case
    cfg = _config(ckpt.vocab)
    pool = PayloadPool(2 * DEPTH * cfg.limits.dense_row_bytes)  # as WorkerLink sizes it
    pool.preallocate(cfg.limits.dense_row_bytes, 2 * DEPTH)
    v = VerifierEndpoint(cfg, session=1, pool=pool)
    w = WorkerEndpoint(cfg, check_outgoing=False)
    w.receive_data(v.hello(), 0.0)
    v.receive_data(w.data_to_send(), 0.0)
    prefix = Prefix(prompt)
    w.receive_data(v.send(context_of(session=1, slot=0, generation=1, tokens=prompt,
                                     digest=prefix.digest)), 0.0)
    decider = EngineDecider(target, slots=1, depth=DEPTH, draws=DrawKeys(b"\x01" * 32))
    target.open(0, prompt)
    return _Pair(w, EngineProposer(drafter), v, decider, target, prefix,
                 normalised(temperature, None, top_p, ckpt.vocab), temperature, top_k,
                 sync=device_clock(target.device))


def one_round(pair: _Pair, clocks: dict[str, _Clock]) -> tuple[dict[str, float], int]:
    """One round; seconds per stage (verifier side only) and the drafts accepted."""
    from pp1q.core.verify import RoundKeys
    from pp1q.verifier import rounds
    from pp1q.verifier.engine_decider import round_p
    from pp1q.wire import Commit, ProposalReady, Step, reply_from_row
    from pp1q.wire.sizes import proposal_fits
    from pp1q.wire.validate import step_form

    pair.round_id += 1
    v, w, prefix = pair.verifier, pair.worker, pair.prefix
    last = prefix.last_position
    step = Step(session=1, slot=0, generation=1, round_id=pair.round_id, last_committed=last,
                first_position=last + 1, prefix_digest=prefix.digest, depth=DEPTH,
                temperature=pair.temperature, top_k=pair.top_k or 0,
                context_version=pair.processors.context_version, seed=SEED)
    t = {}
    t0 = pair.now()
    step_bytes = v.send(step, now=0.0)
    t["framing"] = pair.now() - t0
    w.receive_data(step_bytes, 0.0)  # the worker drafts (untimed)
    form = step_form(step)
    drafted = list(pair.proposer.rows(step, w.context(0)))
    if proposal_fits(step, w.limits):  # the worker daemon's frame for it (drafting.py)
        frames = [w.send_proposal(step, [tok for tok, _ in drafted],
                                  [row for _, row in drafted])]
    else:
        frames = [w.send(reply_from_row(session=1, slot=0, generation=1,
                                        round_id=step.round_id, index=i + 1,
                                        position=step.first_position + i,
                                        token=tok, row=row, form=form))
                  for i, (tok, row) in enumerate(drafted)]
        frames.append(w.send(w.completion(0)))
    stream = b"".join(frames)
    clocks["check"].take()
    clocks["check_proposal"].take()
    t0 = pair.now()
    ready = [e for e in v.receive_data(stream, 0.0) if isinstance(e, ProposalReady)]
    t["q checks"] = clocks["check"].take() + clocks["check_proposal"].take()
    t["framing"] += pair.now() - t0 - t["q checks"]
    if len(ready) != 1:
        raise RuntimeError("the profiled round did not validate")
    ready = ready[0]
    drafts = list(ready.draft_ids)
    t0 = pair.now()
    ok = rounds.proposal_matches(ready.q_rows, drafts,
                                 RoundKeys(SEED, 1, step.round_id, step.first_position))
    t["q decode"] = pair.now() - t0
    if not ok:
        raise RuntimeError("a draft does not follow from its q")
    clocks["forward"].take()
    t0 = pair.now()
    logits = pair.target.score([(0, drafts)])[0]
    score = pair.now() - t0
    t["forward"] = clocks["forward"].take()
    t0 = pair.now()
    p = round_p(pair.processors, False, logits)
    t["p"] = pair.now() - t0
    keys = RoundKeys(pair.decider.draws.seed_for(SEED), 1, step.round_id, step.first_position)
    t0 = pair.now()
    out = pair.decider.verify_proposal(p, ready.q_rows, drafts, keys)
    t["decision"] = pair.now() - t0
    t0 = pair.now()
    pair.target.commit(0, out.accepted, out.token)
    t["cache"] = score - t["forward"] + pair.now() - t0
    commit = Commit(session=1, slot=0, generation=1, round_id=step.round_id,
                    accepted=out.accepted, token=out.token, committed=last + out.accepted + 1)
    t0 = pair.now()
    commit_bytes = v.send(commit)
    t["framing"] += pair.now() - t0
    w.receive_data(commit_bytes, 0.0)
    prefix.extend(drafts[: out.accepted] + [out.token])
    return t, out.accepted


def _target_only(pair: _Pair, clocks) -> tuple[float, float]:
    """A target-only step after the request's prefix, as EngineDecider takes one: (the
    one-row forward, the rest: cache, p and the pick), seconds; rolled back after."""
    from pp1q.verifier import rounds
    from pp1q.verifier.engine_decider import round_p

    clocks["forward"].take()
    t0 = pair.now()
    logits = pair.target.score([(0, [])])[0]
    p = round_p(pair.processors, False, logits)
    rounds.target_only(p[0], pair.decider.draws.seed_for(SEED), 1, pair.round_id + 1,
                       len(pair.prefix), False, kernel=pair.decider.batch.kernel)
    pair.target.reset(0)  # not committed: the profile's request goes on unchanged
    total = pair.now() - t0
    forward = clocks["forward"].take()
    return forward, total - forward


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def run(quick: bool = False) -> Iterator[str]:
    from pp1q.tools.realmodel import bench_skip, load_embedded

    skipped = bench_skip()
    if skipped is not None:
        yield skipped
        return
    from pp1q.models.hf_drafter import HFDrafter
    from pp1q.models.hf_target import HFTarget
    from pp1q.models.text import TextCodec

    n_rounds = QUICK_ROUNDS if quick else ROUNDS
    device = bench_device()
    with _pinned() as how:
        yield how + f"; the model on {_where(device)}"
        ckpt = load_embedded(device)
        prompt = TextCodec(ckpt.tokenizer).encode(PROMPT, chat=True)
        yield (f"model loaded in {ckpt.load_seconds:.1f} s; vocabulary {ckpt.vocab}; prompt "
               f"{len(prompt)} tokens; {WARMUP_ROUNDS} warm-up + {n_rounds} rounds per case, "
               f"medians in ms")
        target = HFTarget.from_checkpoint(ckpt)
        drafter = HFDrafter.early_exit(ckpt, K)
        notes = []
        with probes(target) as clocks:
            yield "| case | " + " | ".join(STAGES) + " | non-forward | / forward | accepted |"
            yield "|---|" + "---:|" * (len(STAGES) + 3)
            for case in CASES:
                pair = open_pair(ckpt, drafter, target, prompt, case)
                samples, accepted, steps = [], [], []
                for r in range(WARMUP_ROUNDS + n_rounds):
                    t, a = one_round(pair, clocks)
                    if r >= WARMUP_ROUNDS:
                        samples.append(t)
                        accepted.append(a)
                        steps.append(_target_only(pair, clocks))
                target.close(0)
                yield _row(case, samples, accepted)
                rounds_s = statistics.median(sum(t.values()) for t in samples)
                step_s = statistics.median(f + rest for f, rest in steps)
                notes.append(
                    f"{_name(case)}: a round {_ms(rounds_s)} ms = {rounds_s / step_s:.2f}x a "
                    f"target-only step ({_ms(step_s)} ms: forward "
                    f"{_ms(statistics.median(f for f, _ in steps))}, the rest "
                    f"{_ms(statistics.median(r for _, r in steps))}), medians")
            yield f"goal: non-forward <= {GOAL:.0%} of the round's forward"
            yield from notes


def _where(device: str) -> str:
    import torch

    if device == "cpu":
        return "the CPU"
    return f"{torch.cuda.get_device_name()} (every clock read waits for the device)"


def _name(case) -> str:
    form, top_k, temperature, top_p = case
    return (f"{form}{f' k={top_k}' if top_k else ''} T={temperature}"
            f"{f' top-p {top_p}' if top_p else ''}")


def _row(case, samples: list[dict[str, float]], accepted: list[int]) -> str:
    med = {s: statistics.median(t[s] for t in samples) for s in STAGES}
    rest = statistics.median(sum(t[s] for s in STAGES if s != "forward") for t in samples)
    ratio = statistics.median(sum(t[s] for s in STAGES if s != "forward") / t["forward"]
                              for t in samples)
    return (f"| {_name(case)} | " + " | ".join(_ms(med[s]) for s in STAGES) +
            f" | {_ms(rest)} | {ratio:.1%} | {','.join(map(str, accepted))} |")
