"""One STEP's answer: the captured worker frames against the live ones, frame by frame.

Frames are compared as soon as both sides have the same index, and then let go: a step
holds only the frames one side has sent and the other not yet (and the summary of the
last captured one, to know a copy of it, below). The first difference is
the step's divergence; nothing after it is compared.

Timing is not the worker's to reproduce, so two things are not divergences:
- a RESET of the step's generation (the verifier gave up on it, or the request ended):
  the worker stops drafting when it reads it, so how many frames it sent first depends
  on when it read it. Only the frames both sides sent are compared.
- a capture whose answer is incomplete (its frames were lost on the way, or the capture
  ended): the frames it has are compared, the rest is not.

Nor is a captured frame equal to the one captured just before it for the same step,
where the capture recorded the worker's frames after a network (``network_copies``: a
verifier's capture): a worker never sends one twice (REPLYs are numbered, the terminal
frame ends the answer), so it is a copy the network made on its way to the verifier (a
chaos run's duplicate), counted in ``copies``. A worker's capture recorded its frames as
it sent them, and the live worker is read directly: a repeat there is the worker's own,
and compared. In the same captures a captured payload that fails its checksum is the
network's corruption (a chaos run's bit flip): the frame is compared by everything
else and its payload by the checksum its intact header claims, counted in
``corrupted``.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from pp1q.tools.replay.answers import Answer, corrupted_on_the_way, difference

# a step's answer is at most 255 REPLYs and a COMPLETION (depth is a u8): a live worker
# this far ahead of the capture on one step is not answering it, and what it sends is
# not kept
MAX_AHEAD = 256


class Outcome(enum.StrEnum):
    MATCHED = "matched"  # every frame of a whole answer equal
    DIVERGED = "diverged"
    PARTIAL = "partial"  # the frames both sides sent equal; the answer was cut (see above)
    NOT_SENT = "not sent"  # the replay gave the connection up before this STEP


@dataclass(frozen=True)
class StepDivergence:
    """Where a step's live answer first differs from the captured one."""

    conn: int
    key: tuple[int, int, int] | None  # (slot, generation, round); None: the handshake
    frame: int  # 1-based index of the frame in the step's answer; 0: the connection's
    position: int | None  # the drafted position it concerns, when one
    what: str

    @property
    def where(self) -> str:
        if self.key is not None:
            return f"slot {self.key[0]}"
        return "handshake" if self.frame else "connection"

    def describe(self) -> str:
        if self.key is None:
            return f"c{self.conn}: {self.what}"
        slot, generation, round_id = self.key
        at = f" position {self.position}" if self.position is not None else ""
        return f"c{self.conn} s{slot} g{generation} r{round_id} frame {self.frame}{at}: {self.what}"


class StepMatch:
    def __init__(self, conn: int, key: tuple[int, int, int] | None, *,
                 network_copies: bool = True) -> None:
        self.conn, self.key = conn, key
        self.network_copies = network_copies  # a captured repeat is the network's (above)
        self.captured: deque[Answer] = deque()  # not yet compared
        self.live: deque[Answer] = deque()
        self.n_captured = self.n_live = 0
        self.captured_ended = self.live_ended = False  # a terminal frame seen
        self.reset = False  # a RESET of its generation was sent: the answer may stop short
        # after a RESET, each side's answer is over once that side sent a frame of a later
        # generation of the slot (a worker's frames are in order, and it read the RESET
        # before the STEP it answers now): what one side sent and the other not is then
        # never compared, and the step is let go (``settled``)
        self.captured_moved_on = self.live_moved_on = False
        self.sent = key is None  # its STEP went to the live worker (a handshake: its HELLO)
        self.divergence: StepDivergence | None = None
        self.copies = 0  # captured frames the network delivered twice (not compared)
        self.corrupted = 0  # captured payloads the network corrupted (checked by checksum)
        self._last_captured: Answer | None = None

    def add_captured(self, a: Answer) -> None:
        if self.network_copies and a == self._last_captured:
            self.copies += 1
            return
        self._last_captured = a
        self.n_captured += 1
        self.captured_ended |= a.terminal
        self.captured.append(a)
        self._compare()

    def add_live(self, a: Answer) -> bool:
        """False once the live worker is MAX_AHEAD frames past the capture: stop reading."""
        self.n_live += 1
        self.live_ended |= a.terminal
        self.live.append(a)
        self._compare()
        if self.n_live - self.n_captured < MAX_AHEAD:
            return True
        if self.divergence is None:
            self._diverge(self.n_live, None, f"live sent {self.n_live} frames, the capture "
                                             f"{self.n_captured}")
        return False

    @property
    def held(self) -> int:
        """Frames kept, waiting for their counterpart."""
        return len(self.captured) + len(self.live)

    @property
    def owed(self) -> bool:
        """The capture shows more of this answer than the live worker has sent, and the
        live worker is still expected to send it. A diverged answer too: the worker's
        state tables take the next frame (a COMMIT) only once it has finished."""
        return self.n_captured > self.n_live and not self.live_ended and not self.reset

    @property
    def settled(self) -> bool:
        """Nothing more of it is expected on either side that could change its outcome."""
        if self.divergence is not None:
            return self.live_ended or self.reset
        if self.reset and self.captured_moved_on and self.live_moved_on:
            return True  # cut at different frames on each side: nothing more comes
        return ((self.captured_ended or self.reset) and (self.live_ended or self.reset)
                and not self.held)

    def _compare(self) -> None:
        if self.divergence is not None:
            self.captured.clear()
            self.live.clear()
            return
        while self.captured and self.live:
            c, v = self.captured.popleft(), self.live.popleft()
            found = difference(c, v, network=self.network_copies)
            if found is not None:
                self._diverge(self.n_live - len(self.live), found[0], found[1])
                return
            self.corrupted += self.network_copies and corrupted_on_the_way(c, v)
        # a frame past the end of a whole captured answer: never part of it
        if self.captured_ended and self.live and not self.reset:
            self._diverge(self.n_captured + 1, None,
                          f"live sent {self.live[0].label()} after the captured answer's end")
        elif self.live_ended and self.captured and not self.reset:
            self._diverge(self.n_live + 1, None,
                          f"live answer ended before the captured {self.captured[0].label()}")

    def _diverge(self, frame: int, position: int | None, what: str) -> None:
        self.divergence = StepDivergence(self.conn, self.key, frame, position, what)
        self.captured.clear()
        self.live.clear()

    def finish(self) -> Outcome:
        """The outcome once the connection is done (no more frames on either side)."""
        if not self.sent and self.n_live == 0:
            return Outcome.NOT_SENT
        short = self.captured_ended and self.n_live < self.n_captured
        if self.divergence is None and not self.reset and short:
            self._diverge(self.n_live + 1, None, f"live sent {self.n_live} of the "
                          f"{self.n_captured} frames captured")
        if self.divergence is not None:
            return Outcome.DIVERGED
        # a handshake has no terminal frame: its one answer is the whole of it
        ended = self.key is None or (self.captured_ended and self.live_ended)
        whole = ended and self.n_live == self.n_captured
        return Outcome.MATCHED if whole else Outcome.PARTIAL


__all__ = ["MAX_AHEAD", "Outcome", "StepDivergence", "StepMatch"]
