"""Vocabulary-sharded ranks in one process: N ShardedRankStates in threads.

``ThreadGroup``: the sampler's collectives among N threads (shard_spmd.deliver, the comm
seam). ``InProcessCollective``: what a RankGroup's exchange thread calls
(``exchange(state, seq, ops, flags)``), run over such ranks: rank 0's ops packed into
real envelope bytes and decoded by every other rank, every rank voting in its own
thread, the summed votes' verdicts applied on every rank. It logs each exchange's ops
and can hold an exchange until the test lets it through, so the order of exchanges is
the test's, not the threads'.
"""

from __future__ import annotations

import threading

import numpy as np

from pp1q.verifier.ranks import ops as rank_ops
from pp1q.verifier.ranks import votes as rank_votes
from pp1q.verifier.ranks.ops import ENVELOPE_BYTES
from pp1q_kernels.shard_spmd import deliver

BARRIER_S = 30.0  # a rank that never arrives fails the test instead of hanging it


class ThreadGroup:
    """Collectives among ``n`` threads: each rank posts its request, all meet, each
    takes its delivery (shard_spmd.deliver), all meet again before the next."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n, timeout=BARRIER_S)
        self.posted: list = [None] * n
        self.calls = 0

    def comm(self, rank: int):
        group = self

        class Comm:
            def run(self, req):
                group.posted[rank] = req
                group.barrier.wait()
                out = deliver(list(group.posted))[rank]
                if rank == 0:
                    group.calls += 1
                group.barrier.wait()
                return out

            def scatter_rows(self, rows, bounds, n_rows):
                if rank == 0:
                    group.posted[0] = rows
                group.barrier.wait()
                lo, hi = bounds[rank]
                out = group.posted[0][:, lo:hi].clone()
                group.barrier.wait()
                return out
        return Comm()


class InProcessCollective:
    """A RankGroup's collective over ``states`` (rank order; rank 0's is the group's).

    ``log``: per exchange that carried ops, its [(kind, slot, upto)]. With ``hold`` set,
    an exchange whose ops satisfy it waits (in the exchange thread) until ``let_through``
    releases it; ``held`` is released each time one starts waiting."""

    def __init__(self, states, limits) -> None:
        self.states, self.limits, self.world = states, limits, len(states)
        self.log: list[list[tuple]] = []
        self.hold = None  # predicate(ops) -> bool
        self.held = threading.Semaphore(0)
        self._gate = threading.Semaphore(0)
        self._env = np.zeros(ENVELOPE_BYTES, np.uint8)
        self._over = np.zeros(limits.max_body, np.uint8)

    def let_through(self, n: int = 1) -> None:
        for _ in range(n):
            self._gate.release()

    def exchange(self, state, seq: int, ops, flags: int = 0):
        assert state is self.states[0]
        if ops and self.hold is not None and self.hold(ops):
            self.held.release()
            assert self._gate.acquire(timeout=BARRIER_S), "the test never let it through"
        rank_ops.pack(seq, ops, flags, self._env, self._over)
        head = rank_ops.read_head(self._env, self.limits)
        decoded = rank_ops.decode(head, rank_ops.body_of(head, self._env, self._over),
                                  self.limits)
        mine = [ops] + [decoded] * (self.world - 1)
        votes = np.zeros((self.world, 1 + len(ops), rank_votes.VOTE_WORDS), np.int64)
        errors: list[BaseException] = []

        def run(r: int) -> None:
            try:
                votes[r, 0] = rank_votes.presence(seq, r)
                for i, v in enumerate(self.states[r].votes(mine[r])):
                    votes[r, 1 + i] = v
            except BaseException as e:  # noqa: BLE001 - re-raised below, in the exchange
                errors.append(e)
        threads = [threading.Thread(target=run, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * BARRIER_S)
        if errors:
            raise errors[0]
        verdicts = rank_votes.verdicts(ops, votes, seq, self.limits)
        for r, s in enumerate(self.states):
            for op, v in zip(mine[r], verdicts, strict=True):
                s.apply(op, v)
        if ops:
            self.log.append([(op.kind, op.slot, op.upto) for op in ops])
        return ops, verdicts, flags

    def close(self) -> None:
        """Nothing to leave: no process group."""
