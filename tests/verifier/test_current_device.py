"""Every thread that runs a model on a numbered GPU makes it its current device.

CUDA keeps the current device per thread: what uses it (page-locked staging, a bare
synchronize, Triton's launches) lands on cuda:0 in a thread that never set it. The
model loader sets it on the daemon's main thread, where the event loop computes p and
decides (tests/verifier/test_daemon_units.py); these tests hold the other threads to it:
EngineDecider's target executor, a follower rank's thread (after its join, which sets
cuda:LOCAL_RANK under nccl) and rank 0's exchange thread. No GPU is needed:
``torch.cuda.set_device`` is replaced by a recorder of (thread, device), and each model
thread's work records its own thread.
"""

from __future__ import annotations

import asyncio
import threading
import types

import pytest
import torch

from pp1q.core.drawkey import DrawKeys
from pp1q.models.engine import make_current
from pp1q.models.toy import ToySpec, ToyTarget
from pp1q.models.toy_engine import ToyTargetEngine
from pp1q.runtime.metrics import Metrics
from pp1q.verifier import engine_decider
from pp1q.verifier.kernel_rounds import KernelRounds
from pp1q.verifier.ranks import follower
from pp1q.verifier.ranks.group import RankGroup
from pp1q.verifier.ranks.launch import DRAW_SECRET
from pp1q.verifier.ranks.ops import FLAG_STOP

GPU = torch.device("cuda", 1)  # a rank's or daemon's own GPU, not the default cuda:0


@pytest.fixture
def made_current(monkeypatch) -> list[tuple[str, str]]:
    """(thread name, device) of every set_device call."""
    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda d: calls.append((threading.current_thread().name, str(d))))
    return calls


def test_a_numbered_gpu_is_made_current_and_nothing_else_is(made_current):
    for device in ("cpu", "cuda", torch.device("cpu"), None):
        make_current(device)
    assert made_current == []  # a plain "cuda" is the current one already
    make_current("cuda:1")
    make_current(GPU)
    name = threading.current_thread().name
    assert made_current == [(name, "cuda:1"), (name, "cuda:1")]


def test_the_target_executor_makes_the_targets_gpu_its_own(made_current, monkeypatch):
    """The target's calls (open, score, commit, close) run in EngineDecider's executor."""
    monkeypatch.setattr(engine_decider, "KernelRounds", lambda _device: KernelRounds("cpu"))
    target = ToyTargetEngine(ToyTarget(ToySpec(vocab=64)))
    target.device = GPU  # where a real target's logits would be
    decider = engine_decider.EngineDecider(target, slots=1, depth=2,
                                           draws=DrawKeys(bytes(range(32))))

    async def work_thread() -> str:
        return await decider._call(lambda: threading.current_thread().name)

    worker = asyncio.run(work_thread())
    assert worker != threading.current_thread().name
    assert made_current == [(worker, "cuda:1")]


def test_a_follower_ranks_thread_makes_its_shards_gpu_its_own_after_joining(
        made_current, monkeypatch):
    """The follower joins and exchanges in one thread, and joining over nccl makes
    cuda:LOCAL_RANK current there: the target's device is made current after the join."""
    class Group:  # what join returns: one exchange, which stops the group
        def exchange(self, _state, _seq):
            ran.append(threading.current_thread().name)
            return None, None, FLAG_STOP

        def close(self):
            pass

    def join(*_args):
        torch.cuda.set_device(torch.device("cuda", 0))  # as collective.py does for nccl
        return Group(), [{DRAW_SECRET: "00" * 32}, {}]

    ran: list[str] = []
    monkeypatch.setattr(follower, "join", join)
    monkeypatch.setattr(follower, "identity", lambda *_a: {})
    settings = types.SimpleNamespace(target_delay_ms=0, metrics_host="127.0.0.1",
                                     metrics_port=None)
    plan = types.SimpleNamespace(rv=types.SimpleNamespace(rank=1, world=2, master=None,
                                                          backend="nccl"))
    target = types.SimpleNamespace(identity="shard", device=GPU)
    replica = types.SimpleNamespace(draws=None, evictions=0)
    status = asyncio.run(follower.serve_follower(
        settings, plan, types.SimpleNamespace(sharded=False), target, Metrics("verifier"),
        asyncio.Event(), lambda *_a: replica))
    assert status == 0 and len(ran) == 1  # the exchange ran in the follower's thread
    assert made_current == [(ran[0], "cuda:0"), (ran[0], "cuda:1")]


def test_rank_zeros_exchange_thread_makes_its_gpu_its_own(made_current, monkeypatch):
    ran: list[str] = []
    monkeypatch.setattr(RankGroup, "_run", lambda self: ran.append(
        threading.current_thread().name))
    group = RankGroup(types.SimpleNamespace(world=2), None, None, 1.0, GPU)

    async def start() -> None:
        group.start()

    asyncio.run(start())
    group._thread.join(5.0)
    assert ran == ["pp1q-ranks"]
    assert made_current == [("pp1q-ranks", "cuda:1")]
