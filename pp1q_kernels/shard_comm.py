"""Vocabulary shard layouts and emulated collectives for the sharding emulator.

N ranks live in one process: each rank's tensors are one entry of a Python list, and
a collective takes the list of every rank's contribution and returns what each rank
receives. The log records each collective and its payload per rank (elements), so
tests can prove that no kernel gathers a full-vocabulary row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pp1q.core.errors import LocalProtocolError, Reason

MAX_SHARDS = 4  # the emulator's scope: TP1..TP4 vocabulary splits


@dataclass(frozen=True)
class ShardLayout:
    """Contiguous global id ranges [lo, hi) covering [0, vocab), in rank order."""

    vocab: int
    bounds: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        edges = [lo for lo, _ in self.bounds] + [self.bounds[-1][1]] if self.bounds else []
        ok = 1 <= len(self.bounds) <= MAX_SHARDS and edges[0] == 0 and edges[-1] == self.vocab
        ok = ok and all(lo < hi for lo, hi in self.bounds)
        ok = ok and all(a[1] == b[0] for a, b in zip(self.bounds, self.bounds[1:], strict=False))
        if not ok:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"bad shard bounds {self.bounds}")

    @classmethod
    def even(cls, vocab: int, n: int) -> ShardLayout:
        """ceil(vocab / n) ids per rank, the last rank takes the (smaller) rest."""
        size = -(-vocab // n)
        bounds = tuple((lo, min(lo + size, vocab)) for lo in range(0, vocab, size))
        if len(bounds) != n:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"{vocab} ids do not make {n} shards")
        return cls(vocab, bounds)

    @classmethod
    def cuts(cls, vocab: int, cuts) -> ShardLayout:
        """Shards split at the given ascending global ids."""
        edges = [0, *cuts, vocab]
        return cls(vocab, tuple(zip(edges[:-1], edges[1:], strict=True)))

    @property
    def n(self) -> int:
        return len(self.bounds)

    def split(self, t: torch.Tensor) -> list[torch.Tensor]:
        """A tensor's per-rank slices along its last (vocabulary) dim."""
        if t.shape[-1] != self.vocab:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "tensor is not vocabulary-wide")
        return [t[..., lo:hi] for lo, hi in self.bounds]

    def owner(self, ids: torch.Tensor) -> torch.Tensor:
        """Rank owning each global id."""
        his = torch.tensor([hi for _, hi in self.bounds], device=ids.device)
        return torch.searchsorted(his, ids.contiguous(), right=True)


@dataclass
class Collectives:
    """Emulated all-reduce / all-gather / broadcast over ``n`` ranks, with a log."""

    n: int
    log: list[tuple[str, int]] = field(default_factory=list)

    def _note(self, op: str, values) -> None:
        if len(values) != self.n:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"{op} needs {self.n} ranks")
        self.log.append((op, int(values[0].numel())))

    def all_reduce_sum(self, values: list[torch.Tensor]) -> torch.Tensor:
        self._note("all_reduce_sum", values)
        return torch.stack(values).sum(0)

    def all_reduce_max(self, values: list[torch.Tensor]) -> torch.Tensor:
        self._note("all_reduce_max", values)
        return torch.stack(values).amax(0)

    def all_gather(self, values: list[torch.Tensor]) -> torch.Tensor:
        """Every rank receives all contributions, stacked on a new last dim (rank order)."""
        self._note("all_gather", values)
        return torch.stack(values, -1)

    def all_gather_list(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        """Contributions of different widths (e.g. top-k candidates), in rank order."""
        self._note("all_gather", values)
        return list(values)

    def broadcast(self, value: torch.Tensor, src: int = 0) -> torch.Tensor:
        self.log.append(("broadcast", int(value.numel())))
        return value

    def max_payload(self) -> int:
        return max((n for _, n in self.log), default=0)
