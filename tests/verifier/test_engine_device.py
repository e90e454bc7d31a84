"""EngineDecider (real models' Decider) decides on its target's device: the rows p it
hands its kernel are tensors where the target's logits are (``Target.device``), never
copied to the host first, and the decisions made there are the ones the CPU's kernel
makes on the same rows. The issue's first lever: "one call per round batched over its
requests, on the target's device".

On the CPU this runs the numba path (reading the tensor's own memory) and the torch lazy
step (PP1Q_DECIDE's two choices); on CUDA, where a GPU is (scripts/device_check.sh), the
torch lazy step on the GPU. The reference decisions are a CPU KernelRounds' on the same
p moved to the host: a device computes its own softmax, so its p may differ from the
CPU's in the last bits, and the claim is about the decision, not the softmax."""

from __future__ import annotations

import asyncio
import importlib.util

import numpy as np
import pytest
import torch
from decider_cases import DEPTH, REGIMES, SLOTS, VOCAB, make_round, proposal, request_job
from host_reads import HostReads

from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import ConfigError
from pp1q.models.engine import Target
from pp1q.verifier import rounds
from pp1q.verifier.engine_decider import EngineDecider
from pp1q.verifier.kernel_rounds import KernelRounds
from pp1q_kernels import lazy_step, numba_rows
from pp1q_kernels.fixed import check_target

TICKS = 24
NUMBA = importlib.util.find_spec("numba") is not None
CUDA = torch.cuda.is_available()


class TableEngine(Target):
    """A target engine whose logits per prompt are given (log p of a table row), made on
    ``device`` as a real model's forward makes them."""

    identity = "table"
    tokenizer_digest = "table"

    def __init__(self, device: str) -> None:
        self.vocab = VOCAB
        self.device = torch.device(device)
        self.table: dict[tuple[int, ...], np.ndarray] = {}
        self.prompts: dict = {}

    def open(self, request, prompt) -> None:
        self.prompts[request] = tuple(prompt)

    def extend(self, request, prompt) -> None:
        self.prompts[request] += tuple(prompt)

    def score(self, batch) -> list[torch.Tensor]:
        with np.errstate(divide="ignore"):  # a zero of p is a -inf logit: masked
            return [torch.from_numpy(np.log(self.table[self.prompts[r]][:len(d) + 1]))
                    .to(self.device) for r, d in batch]

    def commit(self, request, accepted: int, token: int) -> None:
        pass

    def reset(self, request) -> None:
        pass

    def close(self, request) -> None:
        self.prompts.pop(request, None)


class Seen:
    """The decider's kernel, wrapped at the seam its batch decides through: every p it
    was handed (where it was), with the outcomes it gave and, once ``mode`` is set (a
    HostReads), the device reads the call made."""

    def __init__(self, decider: EngineDecider) -> None:
        self.calls: list[tuple[str, list, tuple, list, int]] = []
        self.mode: HostReads | None = None
        kernel = decider.batch.kernel
        sampled, target_only = kernel.sampled, kernel.target_only

        def seen(name, call, p_rows, args, one):
            before = self.mode.reads if self.mode else 0
            out = call(*p_rows, *args) if one else call(p_rows, *args)
            reads = (self.mode.reads if self.mode else 0) - before
            self.calls.append((name, list(p_rows), args, [out] if one else out, reads))
            return out

        kernel.sampled = lambda p_rows, *args: seen("sampled", sampled, p_rows, args, False)
        kernel.target_only = lambda p_row, *args: seen("target_only", target_only, [p_row],
                                                       args, True)


def _decider(device: str, backend: str, draws: DrawKeys) -> tuple[EngineDecider, Seen]:
    before = numba_rows.select(backend)
    try:
        decider = EngineDecider(TableEngine(device), slots=SLOTS, depth=DEPTH, draws=draws)
    finally:
        numba_rows.select(before)
    return decider, Seen(decider)


async def _run(decider: EngineDecider, seed: int) -> list[tuple]:
    """TICKS ticks of SLOTS rounds (every regime, greedy requests among them), each
    round followed by a target-only step; the outcomes in order."""
    g = np.random.default_rng(seed)
    out = []
    for n in range(TICKS):
        rounds = []
        for slot in range(SLOTS):
            job = request_job(g, slot, n + slot)
            p, q = make_round(g, REGIMES[(n + slot) % len(REGIMES)], n % 2 == 1)
            decider.target.table[tuple(job.req.prompt)] = p
            step, ready = proposal(job, q, int(g.integers(1, 1 << 24)),
                                   int(g.integers(1, 1 << 20)))
            if job.req.greedy:
                ready = type(ready)(ready.slot, ready.generation, ready.round_id,
                                    ready.first_position, ready.draft_ids, (), (), True)
            await decider.open(job)
            rounds.append((job, step, ready))
        got = await asyncio.gather(*(decider.decide_round(*r) for r in rounds))
        out += [(o.accepted, o.token, kind) for o, kind in got]
        for job, step, _ in rounds:
            o = await decider.decide_target_only(job, step.generation + 1, step.round_id)
            out.append((o.accepted, o.token))
            decider.close(job)
    return out


def _on_host(kernel: KernelRounds, call: tuple) -> list:
    """What ``kernel`` (the CPU's) decides for a recorded call, its p moved to the host."""
    name, p_rows, args, *_ = call
    host = [p.cpu().numpy() for p in p_rows]
    if name == "sampled":
        return kernel.sampled(host, *args)
    return [kernel.target_only(host[0], *args)]


BACKENDS = [pytest.param("cpu", "numba", marks=pytest.mark.skipif(not NUMBA, reason="no numba")),
            pytest.param("cpu", "torch"),
            pytest.param("cuda", "torch", marks=pytest.mark.skipif(not CUDA, reason="no CUDA"))]


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
def test_rounds_are_decided_where_the_targets_logits_are(device, backend, monkeypatch):
    draws = DrawKeys(bytes(range(32)))
    decider, seen = _decider(device, backend, draws)
    where = decider.batch.kernel.device
    assert where.type == device
    greedy, host_greedy = [], rounds.greedy

    def seen_greedy(p, drafts):  # the greedy rounds' argmax, where p is, and on the host
        out = host_greedy(p, drafts)
        greedy.append((p.device, out, host_greedy(p.cpu().numpy(), drafts)))
        return out

    monkeypatch.setattr(rounds, "greedy", seen_greedy)
    outcomes = asyncio.run(_run(decider, 71))
    assert greedy and all(d == where and out == host for d, out, host in greedy)
    assert {o[0] for o in outcomes if len(o) == 3} == set(range(DEPTH + 1))  # every count
    names = {name for name, *_ in seen.calls}
    assert names == {"sampled", "target_only"}  # both decisions went through the kernel
    for _, p_rows, *_ in seen.calls:  # each p a tensor where the logits were made
        assert all(isinstance(p, torch.Tensor) and p.device == where for p in p_rows)
    reference = KernelRounds("cpu")  # the default CPU path (numba where it is installed)
    for call in seen.calls:
        assert _on_host(reference, call) == call[3]


def test_a_target_misnaming_its_device_is_refused_by_name():
    """An engine whose logits are not where ``Target.device`` says: a ConfigError naming
    the setting, not a decision on rows copied across (or a TypeError from numpy)."""
    decider, _ = _decider("meta", "torch", DrawKeys(bytes(range(32))))  # logits: on the CPU
    decider.target.device = torch.device("cpu")
    g = np.random.default_rng(3)
    job = request_job(g, 0, 0)
    p, q = make_round(g, "close", False)
    decider.target.table[tuple(job.req.prompt)] = p
    step, ready = proposal(job, q, 1, 1)

    async def go():
        await decider.open(job)
        return await decider.decide_round(job, step, ready)

    with pytest.raises(ConfigError, match="names its device meta") as e:
        asyncio.run(go())
    assert e.value.key == "device"


# The reads a decision may make of its device's tensors (each a host sync on a GPU): a
# sampled tick, the drafts' range and counts (1), then per position reached its rows'
# checks, totals and ratio tests (3 each, D positions) and the bonus row's checks and
# totals (2), the pick's underflow and range flags (1) and the outcome (1); a target-only
# pick, its row's check, its total, the pick's flags and the token (4).
SAMPLED_READS = 1 + 3 * DEPTH + 2 + 1 + 1
TARGET_ONLY_READS = 4


def _reads_per_call(per_row: bool = False) -> dict[str, int]:
    """The most device reads one kernel call made, by kind, over the engine-device run on
    the torch lazy step (what a GPU runs), the target's logits marked as on the device.
    ``per_row``: the planted variant, the rows of a position checked one call (and one
    read) a row, as the step checked them before."""
    decider, seen = _decider("cpu", "torch", DrawKeys(bytes(range(32))))
    seen.mode = mode = HostReads()
    score = decider.target.score

    def on_device(batch):  # a GPU target's logits
        out = score(batch)
        mode.on_device(out)
        return out

    decider.target.score = on_device

    def check_rows(rows):
        for r in rows:
            check_target(r)

    with mode, pytest.MonkeyPatch.context() as patch:
        if per_row:
            patch.setattr(lazy_step, "check_rows", check_rows)
        asyncio.run(_run(decider, 73))
    return {name: max(reads for n, *_, reads in seen.calls if n == name)
            for name in ("sampled", "target_only")}


def test_a_decision_reads_few_flags_from_the_device():
    """On a GPU every flag read back waits for the device; the lazy step reads once per
    position, not per row (counted by tests/support/host_reads.py). The planted variant
    (rows checked one call a row, the step before) exceeds the bound."""
    most = _reads_per_call()
    assert 0 < most["sampled"] <= SAMPLED_READS
    assert 0 < most["target_only"] <= TARGET_ONLY_READS
    assert _reads_per_call(per_row=True)["sampled"] > SAMPLED_READS


@pytest.mark.skipif(not NUMBA, reason="no numba")
def test_both_cpu_paths_decide_the_engines_rounds_alike():
    """The numba path reading a CPU tensor's memory and the torch lazy step on the tensor
    itself: the same outcomes for the same rounds (as KernelDecider's are, in
    test_decider_backends)."""
    draws = DrawKeys(bytes(range(32)))
    runs = [asyncio.run(_run(_decider("cpu", backend, draws)[0], 72))
            for backend in ("numba", "torch")]
    assert runs[0] == runs[1]
