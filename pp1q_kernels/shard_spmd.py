"""Collectives for vocabulary-sharded steps that run on real ranks (SPMD), sans-IO.

shard_emulator.py holds every rank in one call; a step that runs on N processes instead
is written once, from one rank's point of view, as a *generator*: it yields a collective
request (``Gather``, ``Sum``, ``Bcast``) with this rank's contribution and is sent back
what the collective delivers. The step never touches a socket or torch.distributed:

- ``drive(step, comm)`` runs it on one real rank (``comm``: gloo or NCCL through
  pp1q.verifier.ranks.shard_collective, or anything with ``run(request)``);
- ``lockstep(steps)`` runs N ranks' generators in one process, in lockstep, and checks
  that every rank asked for the same collective with the same shape (a step whose
  ranks diverge is a bug, reported as ``RanksDivergedError``). Ranks that raise must all
  raise, at the same collective, the same reason: a refusal is decided together.

Every request is logged with its per-rank element count (``CollectiveLog``) so tests
can prove that no collective carries a vocabulary-wide row.

Exactness: ``Sum`` is only ever asked for int64 tensors (integer sums are exact in any
order); ``Gather`` and ``Bcast`` copy bits.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import torch

from pp1q.core.errors import LocalProtocolError, Pp1qError, Reason


@dataclass(frozen=True)
class Gather:
    """Every rank contributes ``t`` (same shape and dtype); all receive [N, *t.shape]."""

    t: torch.Tensor


@dataclass(frozen=True)
class Sum:
    """All-reduce sum of int64 ``t`` (exact)."""

    t: torch.Tensor

    def __post_init__(self) -> None:
        if self.t.dtype != torch.int64:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"Sum of {self.t.dtype}: inexact")


@dataclass(frozen=True)
class Bcast:
    """Rank ``src``'s ``t`` to every rank (the others pass a buffer of the same shape)."""

    t: torch.Tensor
    src: int


Request = Gather | Sum | Bcast
Step = Generator[Request, torch.Tensor, object]


@dataclass(frozen=True)
class Place:
    """This rank's place in a vocabulary split: rank, world and its ids [lo, hi)."""

    rank: int
    world: int
    lo: int
    hi: int
    vocab: int

    @property
    def width(self) -> int:
        return self.hi - self.lo

    @classmethod
    def of(cls, bounds, rank: int) -> Place:
        """From contiguous (lo, hi) bounds in rank order (shard_comm.ShardLayout.bounds)."""
        lo, hi = bounds[rank]
        return cls(rank, len(bounds), lo, hi, bounds[-1][1])


@dataclass
class CollectiveLog:
    """(kind, dtype, elements one rank sends) per collective, in order."""

    entries: list[tuple[str, str, int]] = field(default_factory=list)

    def note(self, req: Request) -> None:
        self.entries.append((type(req).__name__, str(req.t.dtype).removeprefix("torch."),
                             int(req.t.numel())))

    def max_elements(self) -> int:
        return max((n for _, _, n in self.entries), default=0)

    def bytes_sent(self) -> int:
        """Bytes one rank hands to the collectives (its contributions)."""
        return sum(n * getattr(torch, dt).itemsize for _, dt, n in self.entries)


class RanksDivergedError(AssertionError):
    """Simulated ranks asked for different collectives, or failed differently (a bug)."""


def drive(step: Step, comm) -> object:
    """Run one rank's step to its return value over a blocking ``comm``."""
    result = None
    try:
        while True:
            result = comm.run(step.send(result))
    except StopIteration as stop:
        return stop.value


def _advance(step: Step, value):
    """('req', request) | ('done', value) | ('error', exception)."""
    try:
        return "req", step.send(value)
    except StopIteration as stop:
        return "done", stop.value
    except Pp1qError as e:
        return "error", e


def deliver(reqs: list[Request]) -> list[torch.Tensor]:
    """What each simulated rank receives for one collective (every rank's request)."""
    kind = type(reqs[0])
    if any(type(r) is not kind or r.t.shape != reqs[0].t.shape or r.t.dtype != reqs[0].t.dtype
           for r in reqs):
        asked = [(type(r).__name__, tuple(r.t.shape)) for r in reqs]
        raise RanksDivergedError(f"ranks asked for {asked}")
    if kind is Gather:
        out = torch.stack([r.t for r in reqs])
        return [out.clone() for _ in reqs]
    if kind is Sum:
        out = torch.stack([r.t for r in reqs]).sum(0)
        return [out.clone() for _ in reqs]
    src = reqs[0].src
    if any(r.src != src for r in reqs) or not 0 <= src < len(reqs):
        raise RanksDivergedError(f"broadcast sources {[r.src for r in reqs]}")
    return [reqs[src].t.clone() for _ in reqs]


def lockstep(steps: list[Step], log: CollectiveLog | None = None,
             collective: Callable[[list[Request]], list[torch.Tensor]] = deliver) -> list[object]:
    """Run N ranks' steps together in this process; their return values by rank.

    ``collective``: the simulated collective (``deliver``; a test may wrap it, to watch
    the traffic or to plant a faulty rank, the way a real collective is swapped)."""
    states = [_advance(s, None) for s in steps]
    while True:
        kinds = {k for k, _ in states}
        if kinds == {"done"}:
            return [v for _, v in states]
        if kinds == {"error"}:
            reasons = {e.reason for _, e in states}
            if len(reasons) != 1:
                raise RanksDivergedError(f"ranks refused for different reasons {reasons}")
            raise states[0][1]
        if kinds != {"req"}:
            raise RanksDivergedError(f"ranks out of step: {[k for k, _ in states]}")
        reqs = [r for _, r in states]
        if log is not None:
            log.note(reqs[0])
        states = [_advance(s, v) for s, v in zip(steps, collective(reqs), strict=True)]


def simulate(bounds, make: Callable[[Place], Step], **kw) -> list[object]:
    """``lockstep`` over one simulated rank per (lo, hi) of ``bounds``: ``make(place)``
    builds each rank's step."""
    return lockstep([make(Place.of(bounds, r)) for r in range(len(bounds))], **kw)
