"""The captured worker answers against a live worker's, per (connection, slot,
generation, round): sans-IO, fed by ``pp1q.tools.replay.live``.

The replay sends the captured verifier frames in order. Before each it asks ``owed``:
the steps whose captured answer, as far as the capture has shown it, the live worker
has not yet sent in full. Waiting for them keeps every frame in the order the worker
saw it when captured (a COMMIT only after the answer it commits), so a deterministic
worker (same model, preset and seed) has every reason to answer byte for byte the same.

What ends the replay of a connection is decided here too, for the adapter to apply:
``fatal`` (nothing can be compared: the worker refused the session, or does not speak
the wire), ``worker_closed`` (its close, with or without an answer due),
``undecodable`` (its bytes stopped decoding) and ``capture_broken`` (the capture did).
"""

from __future__ import annotations

from pp1q.tools.replay.answers import HANDSHAKE, Answer
from pp1q.tools.replay.live_report import LiveReport
from pp1q.tools.replay.step_match import Outcome, StepDivergence, StepMatch
from pp1q.wire import Reset, Step
from pp1q.wire.messages import type_of


def step_label(key) -> str:
    return "the HELLO" if key is HANDSHAKE else f"STEP s{key[0]} g{key[1]} r{key[2]}"


def frame_label(msg) -> str:
    """A verifier frame as the operator reads it: ``COMMIT s0 g1 r2``, ``RESET s1 g3``."""
    keys = (("s", "slot"), ("g", "generation"), ("r", "round_id"))
    return " ".join([type_of(msg).name, *(f"{p}{getattr(msg, f)}" for p, f in keys
                                          if hasattr(msg, f))])


class AnswerMatcher:
    def __init__(self, report: LiveReport | None = None, *,
                 network_copies: bool = True) -> None:
        self.report = report if report is not None else LiveReport()
        # whether the captured worker frames crossed a network before they were recorded
        # (a verifier's capture): a repeat is then the network's copy (StepMatch)
        self.network_copies = network_copies
        self._steps: dict[int, dict] = {}  # conn -> key -> StepMatch, in the order sent
        self._stray: dict[int, StepDivergence] = {}  # conn -> a divergence outside a step
        # conn -> the live worker's session REFUSAL, and whether its HELLO_ANSWER came first
        self._refusals: dict[int, tuple[Answer, bool]] = {}
        self._fatal: dict[int, str] = {}  # conn -> why nothing on it can be compared
        self._notes: dict[int, str] = {}  # conn -> how the worker closed it, none due
        self._causes: set[int] = set()  # conns whose stray divergence came first
        self._captured_refusals: set[int] = set()  # conns whose capture shows one too
        # (conn, slot) -> (generation, round) of its newest step already settled and let
        # go: what a connection holds is its slots' open steps, not its whole history
        self._floor: dict[tuple[int, int], tuple[int, int]] = {}
        self._diverged: set[int] = set()  # conns with a step let go diverged

    def open(self, conn: int) -> None:
        self._steps[conn] = {HANDSHAKE: self._step(conn, HANDSHAKE)}
        self.report.connections += 1

    def is_open(self, conn: int) -> bool:
        return conn in self._steps

    def sent(self, conn: int, msg) -> None:
        """A captured verifier frame went to the live worker."""
        steps = self._steps[conn]
        if isinstance(msg, Step):
            self._settle(conn, msg.slot)
            key = (msg.slot, msg.generation, msg.round_id)
            steps.setdefault(key, self._step(conn, key)).sent = True
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
        self._moved_on(conn, a.key, live=False)
        if a.key not in steps:
            if self._settled(conn, a.key):
                return  # a late frame of a step its verifier had given up on
            # answering a STEP the capture does not show (it began later)
            steps[a.key] = self._step(conn, a.key)
        steps[a.key].add_captured(a)

    def live(self, conn: int, a: Answer) -> bool:
        """A frame the live worker sent; False once it sent what no replay can keep (a
        frame for a step never sent, or too many for one step): stop reading."""
        self._moved_on(conn, a.key, live=True)
        s = self._steps[conn].get(a.key)
        if s is None and self._settled(conn, a.key):
            return True  # a late frame of a step settled (reset) already: not compared
        if s is None:
            self.stray(conn, f"live {a.label()} for s{a.key[0]} g{a.key[1]} r{a.key[2]}, "
                             "a step the replay never sent")
            return False
        if a.refused_session:
            self._refusals.setdefault(conn, (a, s.n_live > 0))
        return s.add_live(a)

    def _step(self, conn: int, key) -> StepMatch:
        return StepMatch(conn, key, network_copies=self.network_copies)

    def stray(self, conn: int, what: str, cause: bool = False) -> None:
        """A divergence of the connection itself (a live stream that does not decode,
        a frame for no step); the first is kept, reported after the steps' (often their
        consequence) or, a ``cause`` of theirs, before."""
        self._stray.setdefault(conn, StepDivergence(conn, HANDSHAKE, 0, None, what))
        if cause:
            self._causes.add(conn)

    def owed(self, conn: int) -> list[tuple[int, int, int] | None]:
        """Steps whose captured answer the live worker has not yet caught up with."""
        return [k for k, s in self._steps.get(conn, {}).items() if s.owed]

    def diverged(self, conn: int) -> bool:
        """Some answer on ``conn`` already differs (what follows may differ for that)."""
        return conn in self._stray or conn in self._diverged or any(
            s.divergence is not None for s in self._steps.get(conn, {}).values())

    def undecodable(self, conn: int, error: Exception, frames: int) -> None:
        """The live worker's bytes stopped decoding after ``frames`` frames (nothing more
        of them is read)."""
        if frames == 0:  # not even a HELLO_ANSWER: another service's port, not a worker's
            self._fatal.setdefault(conn, "does not speak pp1q wire v2: its first bytes "
                                         f"do not decode ({error})")
        else:  # a worker that answered the session: its bad frame is its divergence,
            # and the cause of the answers it cut short: reported before them
            self.stray(conn, f"the live worker's stream does not decode after {frames} "
                             f"frames: {error}", cause=True)

    def fatal(self, conn: int) -> str | None:
        """Why nothing on ``conn`` can be compared (``pp1q replay`` exit status 3), or None:
        the worker does not speak the wire, or refused the session the capture shows
        accepted (or ended it, after its HELLO_ANSWER, where the capture goes on)."""
        if conn in self._fatal:
            return self._fatal[conn]
        refusal = self._refusals.get(conn)
        if refusal is None or conn in self._captured_refusals:
            return None
        a, answered = refusal
        verb = "ended the session" if answered else "refused the session"
        return f"{verb}: {a.field('reason')}: {a.field('detail')}"

    def worker_closed(self, conn: int, before=None) -> str | None:
        """The live worker closed ``conn`` where the capture shows it open. With an answer
        due (``owed``): the line for the operator (exit status 3), or None after an
        answer on it differed (a worker that diverged may refuse what follows: its close
        is reported with that divergence). With none due, before the replay's next frame
        ``before``: a note, and None. Only an answer lost is a fault: the captured worker
        may have closed there too (on a frame it refused), and the capture shows whether
        it answered anything after; if it did, that answer comes due and is the fault."""
        owed = self.owed(conn)
        if not owed:
            if before is not None:
                self._notes.setdefault(conn, (
                    f"c{conn}: the worker closed the connection before the replay sent "
                    f"its {frame_label(before)}, no answer due; nothing more was sent"))
            return None
        what = f"before answering {step_label(owed[0])}"
        if not self.diverged(conn):
            return f"closed the connection {what}"
        self.stray(conn, f"the worker closed the connection {what}")
        return None

    def capture_broken(self, what: str) -> None:
        """The capture stops being replayable (a stream of it does not decode, or the file
        breaks): compared up to there. The capture's fault, not the worker's: no
        divergence, but not a whole replay either (``pp1q replay`` exit status 2)."""
        self.report.capture_errors.append(what)

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

    def _moved_on(self, conn: int, key, live: bool) -> None:
        """A frame of ``key``: on the side that sent it, the RESET steps of its slot's
        earlier generations get nothing more (StepMatch.settled)."""
        if key is HANDSHAKE:
            return
        for k, s in self._steps[conn].items():
            if s.reset and k is not HANDSHAKE and k[0] == key[0] and k[1] < key[1]:
                if live:
                    s.live_moved_on = True
                else:
                    s.captured_moved_on = True

    def _settled(self, conn: int, key) -> bool:
        floor = self._floor.get((conn, key[0])) if key is not HANDSHAKE else None
        return floor is not None and key[1:] <= floor

    def _record(self, s: StepMatch) -> None:
        self.report.copies += s.copies
        self.report.corrupted += s.corrupted
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
        self._fatal.pop(conn, None)
        note = self._notes.pop(conn, None)
        if note is not None:
            self.report.notes.append(note)
        self._captured_refusals.discard(conn)
        for where in [w for w in self._floor if w[0] == conn]:
            del self._floor[where]
        stray = self._stray.pop(conn, None)
        if stray is not None and conn in self._causes:
            self.report.divergences.append(stray)
        for s in steps.values():
            self._record(s)
        self._diverged.discard(conn)
        if stray is not None and conn not in self._causes:  # after the steps: often
            self.report.divergences.append(stray)  # their consequence
        self._causes.discard(conn)


__all__ = ["AnswerMatcher"]
