"""Fault rules: which frames a fault hits (deterministically or at random) and what it does.

A ``Rule`` matches frames of one direction (and optionally one message type and some
control fields, e.g. ``where={"index": 2}`` for the second row of every proposal) and
fires on the ``nth`` match, then every ``every`` matches, at most ``times`` times; a
``probability`` below 1 (with a seeded ``random.Random``) makes it random, for soaks.
So "the 3rd REPLY frame worker -> verifier" is ``Rule(Drop(), msg_type=REPLY, nth=3)``
and a counter can be required to equal ``rule.fired``.

The fault kinds follow etcd's pkg/proxy (delay, drop, corrupt, pause, blackhole, reset)
plus what frame boundaries make possible: truncate, duplicate, replay a frame of an
older generation, reorder, and a disconnect in the middle of a frame.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from pp1q.wire import MsgType


class Direction(enum.StrEnum):
    TO_WORKER = "to_worker"  # verifier -> worker: HELLO, CONTEXT, STEP, COMMIT, RESET
    TO_VERIFIER = "to_verifier"  # worker -> verifier: HELLO_ANSWER, REPLY, COMPLETION, PROPOSAL


class FaultKind(enum.StrEnum):
    """Every injection the proxy counts (``FaultProxy.injections``)."""

    DELAY = "delay"  # one frame delivered late; later frames pass it
    DROP = "drop"  # one frame never delivered
    BIT_FLIP = "bit_flip"  # one bit of the header, control part or payload inverted
    TRUNCATE = "truncate"  # the payload cut short, header re-made consistent
    DUPLICATE = "duplicate"  # the frame delivered twice in a row
    REPLAY = "replay"  # a copy delivered again once its generation is dead (stale)
    REORDER = "reorder"  # held back until the next frame of the same slot passed it
    DISCONNECT = "disconnect"  # part of the frame written, then the connection reset
    PAUSE = "pause"  # a direction stops forwarding for a while (bytes kept)
    BLACKHOLE = "blackhole"  # a direction silently discards everything for a while
    RESET = "reset"  # every connection reset (RST), between frames


@dataclass(frozen=True)
class Delay:
    seconds: float
    kind = FaultKind.DELAY


@dataclass(frozen=True)
class Drop:
    kind = FaultKind.DROP


@dataclass(frozen=True)
class BitFlip:
    region: str = "payload"  # header, control or payload
    offset: int = 0  # byte within the region (wraps)
    bit: int = 0
    kind = FaultKind.BIT_FLIP


@dataclass(frozen=True)
class Truncate:
    keep: int = 4  # payload bytes kept (at most the payload length minus one)
    kind = FaultKind.TRUNCATE


@dataclass(frozen=True)
class Duplicate:
    kind = FaultKind.DUPLICATE


@dataclass(frozen=True)
class Replay:
    """Deliver a copy again just before the first later frame of the same slot with a
    higher generation: by then the receiver has retired the copy's generation."""

    kind = FaultKind.REPLAY


@dataclass(frozen=True)
class Reorder:
    kind = FaultKind.REORDER


@dataclass(frozen=True)
class Disconnect:
    keep: int | None = None  # bytes of the frame written first (None: half of it)
    kind = FaultKind.DISCONNECT


Fault = Delay | Drop | BitFlip | Truncate | Duplicate | Replay | Reorder | Disconnect
FRAME_FAULTS = (Delay, Drop, BitFlip, Truncate, Duplicate, Replay, Reorder, Disconnect)


def poisons(fault: Fault, mtype: int) -> bool:
    """Whether a proposal whose frame took this fault must never be committed. A delay is
    counted as poisoning: the rules here always delay past the STEP watchdog. A
    replayed copy leaves the original delivery intact. A duplicated REPLY row arrives
    while its step is still open and fails it (duplicate_round). A duplicated COMPLETION
    or PROPOSAL (the PROPOSAL plays the COMPLETION: its arrival is the step's end) reaches
    the verifier after the original made the slot READY, or after the COMMIT: the copy is
    discarded unread as duplicate_round (counted in late_replies_discarded, no fallback)
    and the original proposal stands, so it may be committed."""
    if isinstance(fault, Replay):
        return False
    if isinstance(fault, Duplicate):
        return mtype == MsgType.REPLY
    return True


@dataclass
class Rule:
    fault: Fault
    direction: Direction = Direction.TO_VERIFIER
    msg_type: MsgType | None = None
    where: dict = field(default_factory=dict)  # control fields that must equal these
    nth: int = 1  # first firing on this match (1-based)
    every: int = 0  # then every this many matches (0: only the nth)
    times: int = 1  # at most this many firings (0: no limit)
    probability: float = 1.0  # chance to fire on a due match (needs rng below 1)
    rng: random.Random | None = None
    matched: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        if self.nth < 1 or self.every < 0 or self.times < 0:
            raise ValueError("nth >= 1, every >= 0, times >= 0")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError("probability outside [0, 1]")
        if self.probability < 1.0 and self.rng is None:
            raise ValueError("a random rule needs a seeded rng")

    @property
    def needs_control(self) -> bool:
        return bool(self.where)

    def consider(self, direction: Direction, mtype: int, message) -> bool:
        """Count a frame that passes; True if the fault fires on it."""
        if direction is not self.direction or (self.msg_type is not None
                                               and mtype != self.msg_type):
            return False
        if self.where and (message is None or any(getattr(message, k, None) != v
                                                  for k, v in self.where.items())):
            return False
        self.matched += 1
        if self.times and self.fired >= self.times:
            return False
        m = self.matched - self.nth
        if m < 0 or (m > 0 and (not self.every or m % self.every)):
            return False
        if self.probability < 1.0 and self.rng.random() >= self.probability:
            return False
        self.fired += 1
        return True


def random_frame_rules(rng: random.Random, watchdog_s: float, *, row_p: float,
                       stall_p: float, proposal_p: float, disconnect_p: float = 0.0,
                       bit_offset: int = 7) -> list[Rule]:
    """Seeded, content-blind frame faults on every frame a proposal travels in, each
    kind with its own chance per matching frame:

    - REPLY rows (dense steps, greedy ones, and sparse ones a worker streams): drop, bit
      flip, truncate, duplicate, reorder, stale replay, each ``row_p``;
    - their COMPLETION: a delay past the watchdog, ``stall_p``;
    - a PROPOSAL (a sparse step's every row in one frame, revision 3): bit flip,
      truncate, duplicate, stale replay, each ``proposal_p`` (one frame carries what
      ``depth`` REPLY rows do, so callers give it ``depth`` x ``row_p`` for the same
      chance per proposal); drop, reorder and a delay past the watchdog, each
      ``stall_p``: each of those leaves the step to its STEP watchdog (a reordered
      PROPOSAL waits for the next frame of its slot, which comes only after it);
    - ``disconnect_p``: half a REPLY or PROPOSAL written, then RST (0: none; it ends the
      session, so rows that check the output leave it to its own row).

    The rules never look at what a frame carries (see matrix.py on why)."""
    def rule(fault, mtype, p) -> Rule:
        return Rule(fault, msg_type=mtype, every=1, times=0, probability=p, rng=rng)
    late = Delay(2 * watchdog_s)
    out = [rule(f, MsgType.REPLY, row_p) for f in (Drop(), BitFlip(offset=bit_offset),
                                                   Truncate(), Duplicate(), Reorder(),
                                                   Replay())]
    out.append(rule(late, MsgType.COMPLETION, stall_p))
    if disconnect_p:
        out.append(rule(Disconnect(), MsgType.REPLY, disconnect_p))
    out += [rule(f, MsgType.PROPOSAL, proposal_p)
            for f in (BitFlip(offset=bit_offset), Truncate(), Duplicate(), Replay())]
    out += [rule(f, MsgType.PROPOSAL, stall_p) for f in (Drop(), Reorder(), late)]
    if disconnect_p:
        out.append(rule(Disconnect(), MsgType.PROPOSAL, disconnect_p))
    return out
