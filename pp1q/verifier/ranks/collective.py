"""torch.distributed for the verifier ranks: joining the group, and one exchange.

Joining: every rank opens the rendezvous (a TCP store at ``--rank-master``, hosted by
rank 0, or torchrun's ``env://``) with the long join timeout, then all ranks create the
group the exchanges use with the short ``rank_timeout_s``: a collective that a dead or
hung rank never completes fails after it, on every rank still alive.

An exchange (pp1q.verifier.ranks.ops describes the bytes): broadcast the fixed envelope
from rank 0, broadcast the overflow when the envelope declares one, every rank votes,
one all-reduce (sum) of the vote rows (pp1q.verifier.ranks.votes), every rank applies
the verdicts. Calls block; rank 0 makes them from one thread (pp1q.verifier.ranks.group),
the others from their main loop. Buffers are allocated once, at their bounds, and reused
by every exchange only after the previous one completed on every rank (its all-reduce).

gloo on CPU; NCCL when asked (``--rank-backend nccl``) copies each buffer to the
rank's GPU around the collective (NCCL moves device memory only).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
from dataclasses import dataclass

import numpy as np

from pp1q.core.errors import Pp1qError, Reason, RemoteProtocolError
from pp1q.verifier.ranks import ops as rank_ops
from pp1q.verifier.ranks import votes as rank_votes
from pp1q.verifier.ranks.ops import ENVELOPE_BYTES, Limits, Op
from pp1q.verifier.ranks.replica import RankState
from pp1q.verifier.ranks.votes import VOTE_WORDS, Verdict

log = logging.getLogger("pp1q.verifier.ranks.group")

IDENTITY_BYTES = 1024  # each rank's identity record at join (JSON, zero padded)
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class GroupError(Pp1qError):
    """A collective failed (a rank died, hung past the timeout, or desynchronised)."""

    def __init__(self, timed_out: bool, detail: str) -> None:
        super().__init__(Reason.RANKS_LOST, detail, message=detail)
        self.timed_out = timed_out


@dataclass(frozen=True)
class Rendezvous:
    """How this process joins: rank, world size, and the store (None: env://)."""

    rank: int
    world: int
    master: tuple[str, int] | None
    backend: str
    join_timeout_s: float
    rank_timeout_s: float
    local_rank: int = 0


def make_store(host: str, port: int, world: int, is_master: bool, timeout_s: float,
               listen_fd: int | None = None):
    """The rendezvous store; rank 0 may hand it an already bound listening socket."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, world, is_master=is_master, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s),
                         master_listen_fd=listen_fd)


class Collective:
    """This process's membership in the rank group, and the exchange buffers."""

    def __init__(self, rv: Rendezvous, limits: Limits, store=None) -> None:
        import torch
        import torch.distributed as dist

        self.rank, self.world, self.limits = rv.rank, rv.world, limits
        self._torch, self._dist = torch, dist
        if rv.master is not None and rv.master[0] in _LOOPBACK:
            _prefer_loopback()
        join = datetime.timedelta(seconds=rv.join_timeout_s)
        if store is None and rv.master is not None:
            store = make_store(rv.master[0], rv.master[1], rv.world, rv.rank == 0,
                               rv.join_timeout_s)
        kwargs = {"store": store} if store is not None else {"init_method": "env://"}
        if rv.backend == "nccl":
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # timeouts raise here
            torch.cuda.set_device(rv.local_rank)
            self.device = torch.device("cuda", rv.local_rank)
        else:
            self.device = None
        dist.init_process_group(rv.backend, rank=rv.rank, world_size=rv.world, timeout=join,
                                **kwargs)
        self.group = dist.new_group(list(range(rv.world)), backend=rv.backend,
                                    timeout=datetime.timedelta(seconds=rv.rank_timeout_s))
        self._envelope_t = torch.zeros(ENVELOPE_BYTES, dtype=torch.uint8)
        self.envelope = self._envelope_t.numpy()
        over = max(0, limits.max_body - (ENVELOPE_BYTES - rank_ops.HEAD_BYTES))
        self._overflow_t = torch.zeros(over, dtype=torch.uint8)
        self.overflow = self._overflow_t.numpy()
        self.closed = False

    # -- primitives ----------------------------------------------------------------

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except RuntimeError as e:  # gloo and NCCL report every failure this way
            text = str(e)
            raise GroupError("timed out" in text.lower() or "timeout" in text.lower(),
                             text.splitlines()[0][:300]) from None

    def _broadcast(self, t) -> None:
        if self.device is None:
            self._dist.broadcast(t, 0, group=self.group)
            return
        d = t.to(self.device)
        self._dist.broadcast(d, 0, group=self.group)
        t.copy_(d.cpu())

    def _sum(self, t) -> None:
        if self.device is None:
            self._dist.all_reduce(t, group=self.group)
            return
        d = t.to(self.device)
        self._dist.all_reduce(d, group=self.group)
        t.copy_(d.cpu())

    def gather_rows(self, mine: np.ndarray) -> np.ndarray:
        """Every rank's ``mine`` (same shape everywhere), stacked by rank."""
        rows = np.zeros((self.world, *mine.shape), dtype=np.int64)
        rows[self.rank] = mine
        t = self._torch.from_numpy(rows)
        self._guard(self._sum, t)
        return rows

    def identities(self, record: bytes) -> list[dict]:
        """Every rank's identity record (JSON), by rank: the join-time agreement check."""
        if len(record) > IDENTITY_BYTES:
            raise ValueError(f"identity record of {len(record)} bytes")
        buf = np.zeros(IDENTITY_BYTES, dtype=np.uint8)
        buf[:len(record)] = np.frombuffer(record, dtype=np.uint8)
        rows = self.gather_rows(buf.view(np.int64))
        return [json.loads(rows[r].view(np.uint8).tobytes().rstrip(b"\0"))
                for r in range(self.world)]

    # -- one exchange ----------------------------------------------------------------

    def exchange(self, state: RankState, seq: int, ops: list[Op] | None = None,
                 flags: int = 0) -> tuple[list[Op], list[Verdict], int]:
        """Rank 0 passes ``ops``; the others receive them. Returns (ops, verdicts, flags)
        after this rank applied the verdicts. GroupError when the group is lost."""
        try:
            if self.rank == 0:
                over = rank_ops.pack(seq, ops, flags, self.envelope, self.overflow)
            self._guard(self._broadcast, self._envelope_t)
            head = rank_ops.read_head(self.envelope, self.limits)
            if head.seq != seq:
                raise RemoteProtocolError(Reason.OUT_OF_ORDER, f"exchange {head.seq}")
            if head.overflow_len:
                self._guard(self._broadcast, self._overflow_t[:head.overflow_len])
            if self.rank != 0:
                body = rank_ops.body_of(head, self.envelope, self.overflow)
                ops = rank_ops.decode(head, body, self.limits)
            elif over != head.overflow_len:
                raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, "own envelope")
            mine = np.zeros((1 + len(ops), VOTE_WORDS), dtype=np.int64)
            mine[0] = rank_votes.presence(seq, self.rank)
            for i, vote in enumerate(state.votes(ops)):
                mine[1 + i] = vote
            votes = self.gather_rows(mine)
            verdicts = rank_votes.verdicts(ops, votes, seq, self.limits)
        except RemoteProtocolError as e:  # desynchronised: no later exchange can be trusted
            raise GroupError(False, f"rank {self.rank}: {e}") from None
        diverged = [op.slot for op, v in zip(ops, verdicts, strict=True)
                    if not state.apply(op, v)]
        if diverged:
            log.error("rank %d: committed state of slots %s differs from the decider's",
                      self.rank, diverged)
        return ops, verdicts, head.flags

    def close(self) -> None:
        """Leave the group (after a STOP exchange; after a failure the process just exits)."""
        if not self.closed:
            self.closed = True
            self._dist.destroy_process_group()


def _prefer_loopback() -> None:
    """A group on 127.0.0.1 talks over the loopback interface only (tests, one machine)."""
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    names = [name for _i, name in socket.if_nameindex()]
    if "lo" in names:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
