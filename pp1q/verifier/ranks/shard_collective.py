"""The sharded sampler's collectives over torch.distributed (the rank group's own group).

pp1q_kernels.shard_step is written as per-rank generators that yield collective
requests (pp1q_kernels.shard_spmd); ``ShardComm.run`` carries one out on the group the
exchanges use (pp1q.verifier.ranks.collective.Collective: gloo on CPU, NCCL with each
tensor copied to the rank's GPU and back), so a dead or hung rank fails it after
``rank_timeout_s`` as any exchange: GroupError, the group is lost.

``scatter_rows`` is rank 0 sending each rank only its slice of dense q rows (one
gloo/NCCL scatter; slices padded to the widest shard, which the bytes count).
"""

from __future__ import annotations

import torch

from pp1q_kernels.shard_spmd import Bcast, CollectiveLog, Gather, Request, Sum


class ShardComm:
    """``run(request)`` for shard_spmd.drive, on ``coll``'s group; ``log`` records sizes."""

    def __init__(self, coll, log: CollectiveLog | None = None) -> None:
        self.coll, self.log = coll, log
        self.world, self.rank = coll.world, coll.rank
        self._dist, self._group, self._device = coll._dist, coll.group, coll.device

    def run(self, req: Request) -> torch.Tensor:
        if self.log is not None:
            self.log.note(req)
        return self.coll._guard(self._run, req)

    def _run(self, req: Request) -> torch.Tensor:
        t = req.t.contiguous()
        if self._device is not None:
            t = t.to(self._device)
        if isinstance(req, Gather):
            outs = [torch.empty_like(t) for _ in range(self.world)]
            self._dist.all_gather(outs, t, group=self._group)
            out = torch.stack(outs)
        elif isinstance(req, Sum):
            out = t.clone()
            self._dist.all_reduce(out, group=self._group)
        elif isinstance(req, Bcast):
            out = t.clone()
            self._dist.broadcast(out, req.src, group=self._group)
        else:
            raise TypeError(f"not a collective request: {req!r}")
        return out.cpu() if self._device is not None else out

    def scatter_rows(self, rows: torch.Tensor | None, bounds, n_rows: int) -> torch.Tensor:
        """Rank 0 passes dense rows [n, V]; every rank gets its [n, hi - lo] slice."""
        widest = max(hi - lo for lo, hi in bounds)
        lo, hi = bounds[self.rank]
        out = torch.zeros((n_rows, widest), dtype=torch.int32)  # counts <= 2^24
        parts = None
        if self.rank == 0:
            parts = []
            for a, b in bounds:
                part = torch.zeros((n_rows, widest), dtype=torch.int32)
                part[:, : b - a] = rows[:, a:b]
                parts.append(part)
        if self.log is not None:  # what each rank receives (rank 0 sends N - 1 of them)
            self.log.entries.append(("Scatter", "int32", n_rows * widest))
        self.coll._guard(self._scatter, out, parts)
        return out[:, : hi - lo].to(torch.int64)

    def _scatter(self, out: torch.Tensor, parts) -> None:
        if self._device is None:
            self._dist.scatter(out, parts, src=0, group=self._group)
            return
        d = out.to(self._device)
        dparts = None if parts is None else [p.to(self._device) for p in parts]
        self._dist.scatter(d, dparts, src=0, group=self._group)
        out.copy_(d.cpu())
