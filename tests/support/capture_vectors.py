"""Scripted capture sessions: build them, and (run as a script) write tests/data/*.pp1qcap.

    python tests/support/capture_vectors.py     # regenerate after a deliberate wire/format change

No daemon is involved: a ``VerifierEndpoint`` and a ``WorkerEndpoint`` are wired
together in memory, the worker drafting with the worker daemon's proposal chain
(pp1q.worker.proposer: build_row, sample, proposal_u24) and the verifier deciding like
its scheduler (pp1q.verifier.rounds: ``sampled`` through the kernel rounds, greedy argmax,
target-only draws).
The capture is taken on the verifier's side, as ``pp1q verifier --capture`` records:
one wire v2 (revision 3) connection, the request context in its CONTEXT frames. The
worker answers as its daemon does (pp1q.worker.drafting): a sparse step that fits one
frame (``sizes.proposal_fits``: here top_k <= 6, as dense rows of vocabulary 64 bound a
payload to 256 bytes) with one PROPOSAL, any other step with a REPLY per position and a
COMPLETION. A fixed clock and the BLAS-free vector models
(pp1q.tools.replay.vector_models) make every byte reproducible.

These files are the project's compatibility vectors: a change that makes them fail to
replay, or regenerate differently, is a wire change and needs a version bump.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from pp1q.core.errors import Reason
from pp1q.core.prefix import Prefix
from pp1q.core.q import SEMANTIC_ID
from pp1q.core.rng import RNG_ABI_ID
from pp1q.models.toy import vocab_map_id
from pp1q.runtime.capture import CaptureWriter, Direction, Protocol, Role
from pp1q.tools.replay.vector_models import VectorDrafter, VectorTarget
from pp1q.verifier import rounds
from pp1q.wire import (
    WIRE_V1,
    WIRE_V2,
    Commit,
    Form,
    Identity,
    Limits,
    Reset,
    SlotState,
    Step,
    VerifierEndpoint,
    WireConfig,
    WorkerEndpoint,
    context_of,
    proposal_from_rows,
    reply_from_row,
)
from pp1q.wire.events import ProposalFailed, ProposalReady, StepRequested
from pp1q.wire.framing import HEADER_BYTES, read_header
from pp1q.wire.session_config import PRECISION, VERIFIER_ID
from pp1q.wire.sizes import proposal_fits
from pp1q.wire.validate import step_form
from pp1q.worker.proposer import ProposalSpec, propose, propose_greedy

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
VOCAB = 64  # dense rows of 256 bytes keep the files small
MODEL_SEED = 11
DEPTH = 5  # the design's fixed depth
SUPPORT = 16  # sparse top-k cap offered by both ends
SLOTS = 3  # the verifier's slots: fallback_v2 runs three requests side by side
STEP_TIMEOUT_S = 0.5  # the verifier's watchdog (stated in the capture's INFO record)
TICK_NS = 40_000  # the fixed clock advances this much per delivered chunk
WALL_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z: capture header start time
NAMES = ("clean_v2", "fallback_v2", "greedy_v1")


@dataclass
class Request:
    slot: int
    prompt: list[int]
    seed: int
    temperature: float = 1.0
    top_k: int = 0  # 0: dense
    prefix: Prefix = field(init=False)
    generation: int = 1
    round_id: int = 0
    worker_holds: int = 0  # committed tokens the worker holds (CONTEXT, then COMMITs)

    def __post_init__(self) -> None:
        self.prefix = Prefix(self.prompt)


class Session:
    """Two endpoints, one capture. Faults are applied to the worker's frames in transit."""

    def __init__(self, path: Path, *, session: int, verifier_versions, worker_versions,
                 check_outgoing: bool = True) -> None:
        self.drafter = VectorDrafter(VOCAB, MODEL_SEED)
        self.target = VectorTarget(VOCAB, MODEL_SEED)
        ident = Identity(q_semantic_id=SEMANTIC_ID, verifier_id=VERIFIER_ID, vocab=VOCAB,
                         id_map_hash=vocab_map_id(VOCAB), draft_id=self.drafter.identity,
                         draft_adapted=False, target_id=self.target.identity,
                         rng_abi=RNG_ABI_ID, precision=PRECISION)
        v_limits = Limits.make(vocab=VOCAB, max_slots=SLOTS, max_depth=DEPTH,
                               max_support=SUPPORT, max_inflight=SLOTS)
        w_limits = Limits.make(vocab=VOCAB, max_slots=8, max_depth=16, max_support=SUPPORT,
                               max_inflight=8)
        self.v = VerifierEndpoint(WireConfig(ident, v_limits, verifier_versions),
                                  session=session, step_timeout=STEP_TIMEOUT_S)
        self.w = WorkerEndpoint(WireConfig(ident, w_limits, worker_versions),
                                check_outgoing=check_outgoing)
        self.t_ns = 1_000_000_000
        self.cap = CaptureWriter(path, role=Role.VERIFIER, wall_ns=WALL_NS)
        # the label the checked-in captures were recorded with (this file's path then)
        self.cap.info({"step_timeout_s": STEP_TIMEOUT_S, "generator": "tests/capture_vectors.py"},
                      self.now)
        self.wire = self.cap.open_conn(Protocol.WIRE, "worker.example:7070", self.now)
        self.events: list = []
        self.commits: list[dict] = []
        self.reply_hook = None  # (step, reply) -> reply: a worker bug, for fault sessions
        self.proposal_hook = None  # (step, proposal) -> proposal: likewise, for PROPOSALs
        self.send_to_worker(self.v.hello())

    @property
    def now(self) -> float:
        return self.t_ns / 1e9

    def tick(self, ns: int = TICK_NS) -> None:
        self.t_ns += ns

    # -- transport ---------------------------------------------------------------

    def send_to_worker(self, data: bytes) -> list[list[bytes]]:
        """Verifier -> worker (recorded OUT); returns the worker's frames in answer, a
        list per STEP in ``data``."""
        self.tick()
        self.cap.record(Direction.OUT, self.wire, self.now, data)
        answers = []
        for ev in self.w.receive_data(data, self.now):
            if isinstance(ev, StepRequested):
                answers.append(self._draft(ev.step))
        out = self.w.data_to_send()
        if out:
            self.deliver(out)
        return answers

    def deliver(self, data: bytes) -> list:
        """Worker -> verifier bytes as the verifier's socket received them (recorded IN)."""
        self.tick()
        self.cap.record(Direction.IN, self.wire, self.now, data)
        events = self.v.receive_data(data, self.now)
        self.events.extend(events)
        return events

    def send_context(self, req: Request) -> None:
        """What the worker lacks of the committed prefix: all of it first, afterwards a
        fallback's token (COMMIT extends the worker's copy by itself)."""
        start = req.worker_holds
        self.send_to_worker(self.v.send(context_of(
            session=self.v.session, slot=req.slot, generation=req.generation,
            tokens=req.prefix.tokens[start:], start=start, digest=req.prefix.digest)))
        req.worker_holds = len(req.prefix)

    # -- the worker ----------------------------------------------------------------

    def _draft(self, step: Step) -> list[bytes]:
        """The worker's frames for ``step``: one PROPOSAL when it fits one frame (what the
        worker daemon sends), else a REPLY per position and the COMPLETION."""
        prefix = Prefix(self.w.context(step.slot))
        assert prefix.digest == step.prefix_digest, "worker and verifier prefixes differ"
        form = step_form(step)
        if form is Form.TOKEN_ONLY:
            rows = [(t, None) for t in propose_greedy(self.drafter, prefix.tokens, step.depth)]
        else:
            spec = ProposalSpec(seed=step.seed, generation=step.generation,
                                round_id=step.round_id, first_position=step.first_position,
                                depth=step.depth, temperature=step.temperature,
                                top_k=step.top_k or None)
            rows = list(propose(self.drafter, prefix.tokens, spec))
        if proposal_fits(step, self.w.limits):
            tokens, q_rows = [t for t, _ in rows], [r for _, r in rows]
            if self.proposal_hook is None:
                return [self.w.send_proposal(step, tokens, q_rows)]
            prop = proposal_from_rows(
                session=step.session, slot=step.slot, generation=step.generation,
                round_id=step.round_id, first_position=step.first_position,
                context_version=step.context_version, tokens=tokens, rows=q_rows)
            return [self.w.send(self.proposal_hook(step, prop))]
        frames = []
        for index, (token, row) in enumerate(rows, start=1):
            reply = reply_from_row(
                session=step.session, slot=step.slot, generation=step.generation,
                round_id=step.round_id, index=index, position=step.first_position + index - 1,
                token=token, row=row, form=form, dense_len=self.w.limits.dense_len)
            if self.reply_hook is not None:
                reply = self.reply_hook(step, reply)
            frames.append(self.w.send(reply))
        frames.append(self.w.send(self.w.completion(step.slot)))
        return frames

    # -- the verifier (as its scheduler does it) -----------------------------------------

    def step(self, req: Request) -> Step:
        if req.worker_holds < len(req.prefix):
            self.send_context(req)
        req.round_id += 1
        last_committed = req.prefix.last_position
        return Step(session=self.v.session, slot=req.slot, generation=req.generation,
                    round_id=req.round_id, last_committed=last_committed,
                    first_position=last_committed + 1,
                    prefix_digest=req.prefix.digest, depth=DEPTH, temperature=req.temperature,
                    top_k=req.top_k, context_version=0, seed=req.seed)

    def send_steps(self, steps: list[Step]) -> list[list[bytes]]:
        """One write with every STEP (a batch); the worker's frames per step."""
        data = b"".join(self.v.send(s, self.now) for s in steps)
        per_step = self.send_to_worker(data)
        assert len(per_step) == len(steps), "the worker drafts every STEP of the batch"
        return per_step

    def decide(self, req: Request, ready: ProposalReady) -> None:
        drafts = list(ready.draft_ids)
        step = self.v.slots[req.slot].step
        if ready.greedy:
            out = rounds.greedy(self.target.logits(req.prefix.tokens, drafts), drafts)
        else:
            p = self.target.probs(req.prefix.tokens, drafts)
            out = rounds.sampled(p, ready.q_rows, drafts, rounds.RoundKeys(
                req.seed, step.generation, step.round_id, step.first_position))
        commit = Commit(session=self.v.session, slot=req.slot, generation=req.generation,
                        round_id=req.round_id, accepted=out.accepted, token=out.token,
                        committed=step.last_committed + out.accepted + 1)
        self.send_to_worker(self.v.send(commit, self.now))
        self.commits.append({"slot": req.slot, "generation": req.generation,
                             "round_id": req.round_id, "accepted": out.accepted,
                             "token": out.token, "committed": commit.committed})
        req.prefix.extend(drafts[:out.accepted] + [out.token])
        req.worker_holds = len(req.prefix)  # the worker appended the same from the COMMIT

    def fall_back(self, req: Request, failed: ProposalFailed) -> None:
        """RESET first, then one target-only token; the next round is a new generation."""
        self.send_to_worker(self.v.send(Reset(session=self.v.session, slot=req.slot,
                                              generation=req.generation,
                                              reason=failed.reason), self.now))
        p = self.target.probs(req.prefix.tokens, [])[0]
        out = rounds.target_only(p, req.seed, req.generation, req.round_id,
                                 req.prefix.last_position + 1, req.temperature == 0)
        req.prefix.extend([out.token])
        req.generation += 1  # the worker keeps the prefix: next round appends the token

    def settle(self, req: Request, events: list) -> None:
        for ev in events:
            if getattr(ev, "slot", None) != req.slot:
                continue
            if isinstance(ev, ProposalReady):
                self.decide(req, ev)
            elif isinstance(ev, ProposalFailed):
                self.fall_back(req, ev)

    def finish(self, reqs: list[Request]) -> None:
        data = b"".join(self.v.send(Reset(session=self.v.session, slot=r.slot,
                                          generation=r.generation, reason=Reason.CANCELLED),
                                    self.now) for r in reqs)
        self.send_to_worker(data)
        self.tick()
        self.cap.close_conn(self.wire, "verifier shutdown", self.now)
        self.cap.close()


# ---------------------------------------------------------------------------
# the three sessions


def _run_round(s: Session, reqs: list[Request], fault=None) -> None:
    """One batch: STEPs for every request, replies interleaved row by row, decisions.

    ``fault(req, frames) -> (frames delivered now, frames delivered late)``.
    """
    steps = [s.step(r) for r in reqs]
    per_step = s.send_steps(steps)
    late: list[bytes] = []
    plan = []
    for r, frames in zip(reqs, per_step, strict=True):
        now, later = fault(r, frames) if fault else (frames, [])
        plan.append(now)
        late.extend(later)
    events = []
    for i in range(max(len(p) for p in plan)):
        for frames in plan:
            if i < len(frames):
                events.extend(s.deliver(frames[i]))
    for r in reqs:
        s.settle(r, events)
    if any(s.v.slots[r.slot].state is SlotState.STEPPING for r in reqs):
        s.tick(int(STEP_TIMEOUT_S * 1e9))  # nothing more arrives: the watchdog's deadline
        timeouts = s.v.check_timeouts(s.now)
        s.events.extend(timeouts)
        for r in reqs:
            s.settle(r, timeouts)
    if late:
        s.deliver(b"".join(late))  # after the RESET: discarded as stale


def _flip_payload_byte(frame: bytes, at: int) -> bytes:
    """``frame`` with payload byte ``at`` flipped (negative: from the payload's end)."""
    h = read_header(frame)
    i = HEADER_BYTES + h.control_len + (at % h.payload_len)
    return frame[:i] + bytes([frame[i] ^ 0x40]) + frame[i + 1:]


def clean_v2(path: Path) -> Session:
    s = Session(path, session=0x0C1EA0000000002, verifier_versions=(WIRE_V2, WIRE_V1),
                worker_versions=(WIRE_V2, WIRE_V1))
    reqs = [Request(0, [3, 14, 15, 9], seed=2026, temperature=1.0),
            Request(1, [2, 7, 18], seed=77, temperature=0.8, top_k=6)]  # a PROPOSAL a step
    for _ in range(3):
        _run_round(s, reqs)
    s.finish(reqs)
    return s


def fallback_v2(path: Path) -> Session:
    """Slot 0 (dense, row by row) and slot 2 (sparse top-k 4, one PROPOSAL a step) meet
    three faults each: corrupt q bytes, a row without q (slot 0) or a token its row
    cannot have drawn (slot 2), lost frames; slot 1 (sparse top-k 12: too wide for one
    frame, row by row) runs clean beside them."""
    s = Session(path, session=0xFA11BAC000000002, verifier_versions=(WIRE_V2,),
                worker_versions=(WIRE_V2, WIRE_V1), check_outgoing=False)
    reqs = [Request(0, [5, 6, 7], seed=4242, temperature=1.0),
            Request(1, [8, 9], seed=99, temperature=0.7, top_k=12),
            Request(2, [30, 31, 32], seed=31337, temperature=0.9, top_k=4)]

    def corrupt(r, frames):
        if r.slot == 0:
            return frames[:1] + [_flip_payload_byte(frames[1], 9)] + frames[2:], []
        if r.slot == 2:  # the last q byte of the PROPOSAL's last row
            return [_flip_payload_byte(frames[0], -1)], []
        return frames, []

    def lose(r, frames):
        return ([], frames) if r.slot in (0, 2) else (frames, [])

    _run_round(s, reqs)
    _run_round(s, reqs, corrupt)
    _run_round(s, reqs)
    s.reply_hook, s.proposal_hook = _strip_q_of_row_3, _token_outside_row_3
    _run_round(s, reqs)
    s.reply_hook = s.proposal_hook = None
    _run_round(s, reqs, lose)
    _run_round(s, reqs)
    s.finish(reqs)
    return s


def _strip_q_of_row_3(step: Step, reply):
    """A buggy worker: row 3 of slot 0 leaves without its q (token only)."""
    if step.slot != 0 or reply.index != 3:
        return reply
    return reply_from_row(session=reply.session, slot=reply.slot, generation=reply.generation,
                          round_id=reply.round_id, index=3, position=reply.position,
                          token=reply.token, row=None, form=Form.TOKEN_ONLY)


def _token_outside_row_3(step: Step, prop):
    """A buggy worker: position 3 of slot 2 names a token its row gives q = 0 (the row
    and its checksum intact: only the row check against the token can see it)."""
    if step.slot != 2:
        return prop
    tokens = list(prop.tokens)
    tokens[2] = min(set(range(VOCAB)) - set(prop.ids[2].tolist()))
    return msgspec.structs.replace(prop, tokens=tokens)


def greedy_v1(path: Path) -> Session:
    s = Session(path, session=0x6EEED1000000001, verifier_versions=(WIRE_V1,),
                worker_versions=(WIRE_V2, WIRE_V1))
    reqs = [Request(0, [1, 2, 3], seed=0, temperature=0.0),
            Request(1, [40, 41], seed=0, temperature=0.0)]
    for _ in range(3):
        _run_round(s, reqs)
    s.finish(reqs)
    return s


BUILDERS = {"clean_v2": clean_v2, "fallback_v2": fallback_v2, "greedy_v1": greedy_v1}


def expected(s: Session) -> dict:
    """The companion JSON: what replaying the capture must reproduce."""
    ready = [e for e in s.events if isinstance(e, ProposalReady)]
    failed = [e for e in s.events if isinstance(e, ProposalFailed)]
    return {
        "wire_version": s.v.version,
        "target_id": s.target.identity,
        "step_timeout_s": STEP_TIMEOUT_S,
        "proposals_ready": len(ready),
        "failures": [{"slot": e.slot, "generation": e.generation, "round_id": e.round_id,
                      "reason": e.reason.value} for e in failed],
        "discarded": sum(s.v.discarded.values()),
        "commits": s.commits,
    }


def build(name: str, directory: Path) -> dict:
    """Write ``name``.pp1qcap into ``directory``; returns its expectations (the JSON)."""
    return expected(BUILDERS[name](directory / f"{name}.pp1qcap"))


def main(directory: Path = DATA_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        exp = build(name, directory)
        (directory / f"{name}.json").write_text(json.dumps(exp, indent=1) + "\n")
        print(f"{name}: {len(exp['commits'])} commits, {len(exp['failures'])} failures")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA_DIR)
