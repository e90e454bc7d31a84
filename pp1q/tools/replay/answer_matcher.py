"""The captured worker answers against a live worker's, per (connection, slot,
generation, round): sans-IO, fed by ``pp1q.tools.replay.live``.

The replay sends the captured verifier frames in order. Before each it asks ``owed``:
the steps whose captured answer, as far as the capture has shown it, the live worker
has not yet sent in full. Waiting for them keeps every frame in the order the worker
saw it when captured (a COMMIT only after the answer it commits), so a deterministic
worker (same model, preset and seed) has every reason to answer byte for byte the same.
"""

from __future__ import annotations

from pp1q.tools.replay.answers import HANDSHAKE, Answer
from pp1q.tools.replay.live_report import LiveReport
from pp1q.tools.replay.step_match import Outcome, StepDivergence, StepMatch
from pp1q.wire import Reset, Step


class AnswerMatcher:
    def __init__(self, report: LiveReport | None = None) -> None:
        self.report = report if report is not None else LiveReport()
        self._steps: dict[int, dict] = {}  # conn -> key -> StepMatch, in the order sent
        self._stray: dict[int, StepDivergence] = {}  # conn -> a divergence outside a step
        self._refusals: dict[int, Answer] = {}  # conn -> the live worker's session REFUSAL
        self._captured_refusals: set[int] = set()  # conns whose capture shows one too
        # (conn, slot) -> (generation, round) of its newest step already settled and let
        # go: what a connection holds is its slots' open steps, not its whole history
        self._floor: dict[tuple[int, int], tuple[int, int]] = {}
        self._diverged: set[int] = set()  # conns with a step let go diverged

    def open(self, conn: int) -> None:
        self._steps[conn] = {HANDSHAKE: StepMatch(conn, HANDSHAKE)}
        self.report.connections += 1

    def is_open(self, conn: int) -> bool:
        return conn in self._steps

    def sent(self, conn: int, msg) -> None:
        """A captured verifier frame went to the live worker."""
        steps = self._steps[conn]
        if isinstance(msg, Step):
            self._settle(conn, msg.slot)
            key = (msg.slot, msg.generation, msg.round_id)
            steps.setdefault(key, StepMatch(conn, key)).sent = True
        elif isinstance(msg, Reset):  # every generation up to it is dead on that slot:
            # an answer still open on either side may stop anywhere now
            for key, s in steps.items():
                if (key is not HANDSHAKE and key[0] == msg.slot and key[1] <= msg.generation
                        and not (s.captured_ended and s.live_ended)):
                    s.reset = True

    def captured(self, conn: int, a: Answer) -> None:
        """A worker frame of the capture (in record order)."""
        steps = self._steps[conn]
        if a.refused_session:
            self._captured_refusals.add(conn)
        if a.key not in steps:
            if self._settled(conn, a.key):
                return  # a late frame of a step its verifier had given up on
            # answering a STEP the capture does not show (it began later)
            steps[a.key] = StepMatch(conn, a.key)
        steps[a.key].add_captured(a)

    def live(self, conn: int, a: Answer) -> bool:
        """A frame the live worker sent; False once it sent what no replay can keep (a
        frame for a step never sent, or too many for one step): stop reading."""
        s = self._steps[conn].get(a.key)
        if s is None and self._settled(conn, a.key):
            return True  # a late frame of a step settled (reset) already: not compared
        if s is None:
            self.stray(conn, f"live {a.label()} for s{a.key[0]} g{a.key[1]} r{a.key[2]}, "
                             "a step the replay never sent")
            return False
        if a.refused_session:
            self._refusals.setdefault(conn, a)
        return s.add_live(a)

    def stray(self, conn: int, what: str) -> None:
        """A divergence of the connection itself (a live stream that does not decode,
        a frame for no step); the first is kept."""
        self._stray.setdefault(conn, StepDivergence(conn, HANDSHAKE, 0, None, what))

    def owed(self, conn: int) -> list[tuple[int, int, int] | None]:
        """Steps whose captured answer the live worker has not yet caught up with."""
        return [k for k, s in self._steps.get(conn, {}).items() if s.owed]

    def diverged(self, conn: int) -> bool:
        """Some answer on ``conn`` already differs (what follows may differ for that)."""
        return conn in self._stray or conn in self._diverged or any(
            s.divergence is not None for s in self._steps.get(conn, {}).values())

    def refused(self, conn: int) -> str | None:
        """Why the live worker refused the session the capture shows accepted, or None."""
        a = self._refusals.get(conn)
        if a is None or conn in self._captured_refusals:
            return None
        return f"{a.field('reason')}: {a.field('detail')}"

    def _settle(self, conn: int, slot: int) -> None:
        """A new STEP on ``slot``: its earlier steps whose answers are over (they are, but
        for a worker still sending a reset one) get their outcomes and are let go."""
        steps = self._steps[conn]
        for key, s in list(steps.items()):
            if key is not HANDSHAKE and key[0] == slot and s.settled:
                self._record(s)
                del steps[key]
                self._floor[(conn, slot)] = max(self._floor.get((conn, slot), key[1:]),
                                                key[1:])

    def _settled(self, conn: int, key) -> bool:
        floor = self._floor.get((conn, key[0])) if key is not HANDSHAKE else None
        return floor is not None and key[1:] <= floor

    def _record(self, s: StepMatch) -> None:
        self.report.copies += s.copies
        outcome = s.finish()
        if s.key is HANDSHAKE and outcome is Outcome.MATCHED:
            return  # a session, not a step: counted only when it differs
        self.report.outcomes[outcome] += 1
        if s.divergence is not None:
            self.report.divergences.append(s.divergence)
            self._diverged.add(s.conn)

    def close(self, conn: int) -> None:
        """No more frames on ``conn``, captured or live: every step gets its outcome."""
        steps = self._steps.pop(conn, None)
        if steps is None:
            return
        self._refusals.pop(conn, None)
        self._captured_refusals.discard(conn)
        for where in [w for w in self._floor if w[0] == conn]:
            del self._floor[where]
        for s in steps.values():
            self._record(s)
        self._diverged.discard(conn)
        stray = self._stray.pop(conn, None)
        if stray is not None:  # after the steps: often their consequence
            self.report.divergences.append(stray)

    def close_all(self) -> None:
        for conn in list(self._steps):
            self.close(conn)


__all__ = ["AnswerMatcher"]
