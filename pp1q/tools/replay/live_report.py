"""What ``pp1q replay FILE --worker HOST:PORT`` found: steps matched, diverged or cut
short, each diverged step's first difference, and where the capture itself broke."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from pp1q.tools.replay.step_match import Outcome, StepDivergence


@dataclass
class LiveReport:
    worker: str = ""
    connections: int = 0  # captured connections replayed (each a live one)
    skipped: int = 0  # captured connections without their HELLO: nothing to replay
    outcomes: collections.Counter = field(default_factory=collections.Counter)  # Outcome ->
    divergences: list[StepDivergence] = field(default_factory=list)  # in step order
    # where the capture stops being replayable (a stream that does not decode, a file cut
    # or corrupt part-way): compared up to there, not the live worker's doing
    capture_errors: list[str] = field(default_factory=list)
    copies: int = 0  # captured frames the network delivered twice, not compared
    corrupted: int = 0  # captured payloads the network corrupted, checked by checksum
    notes: list[str] = field(default_factory=list)  # what differed but lost no answer

    @property
    def ok(self) -> bool:
        """Every answer the capture holds was compared and matched."""
        return not self.divergences and not self.capture_errors

    @property
    def steps(self) -> int:
        return sum(self.outcomes.values())

    def first_per_slot(self) -> list[StepDivergence]:
        """The first diverged step of each (connection, slot): later steps of a slot
        whose answer already differed say little more (their prefixes differ too)."""
        seen, out = set(), []
        for d in self.divergences:
            where = (d.conn, d.where)
            if where not in seen:
                seen.add(where)
                out.append(d)
        return out

    def lines(self) -> list[str]:
        firsts = self.first_per_slot()
        out = []
        for d in firsts:
            out.append(f"!! DIVERGENCE   {d.where}: {d.describe()}")
        out += [f"# note: {n}" for n in self.notes]
        out.append(self.summary())
        return out

    def summary(self) -> str:
        o = self.outcomes
        text = (f"# live worker {self.worker}: {self.connections} connections, "
                f"{self.steps} steps: {o[Outcome.MATCHED]} matched, "
                f"{o[Outcome.DIVERGED]} diverged, {o[Outcome.PARTIAL]} cut short")
        if o[Outcome.NOT_SENT]:
            text += f", {o[Outcome.NOT_SENT]} not sent (connection given up)"
        if self.skipped:
            text += f"; {self.skipped} connections without their HELLO not replayed"
        if self.copies:
            text += f"; {self.copies} captured frames were network copies, not compared"
        if self.corrupted:
            text += (f"; {self.corrupted} captured payloads were corrupted on the way, "
                     "checked by the checksums their headers claim")
        if self.capture_errors:
            text += "; the capture breaks part-way: compared up to there"
        return text

    def as_json(self) -> dict:
        def one(d: StepDivergence) -> dict:
            slot, generation, round_id = d.key if d.key is not None else (None,) * 3
            return {"conn": d.conn, "slot": slot, "generation": generation,
                    "round_id": round_id, "frame": d.frame, "position": d.position,
                    "what": d.what}

        return {"ok": self.ok, "worker": self.worker, "connections": self.connections,
                "skipped": self.skipped, "copies": self.copies,
                "corrupted": self.corrupted,
                "capture_errors": list(self.capture_errors), "notes": list(self.notes),
                "steps": {o.value: self.outcomes[o] for o in Outcome},
                "first_per_slot": [one(d) for d in self.first_per_slot()],
                "divergences": [one(d) for d in self.divergences]}


__all__ = ["LiveReport"]
