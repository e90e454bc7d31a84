"""The worker's speculative state per (wire session, slot): the committed prefix it drafts
after, under which generation, and the drafts of the round awaiting its COMMIT.

Fed by three inputs: SetContext (context channel), COMMIT and RESET (wire). Every
lookup names the generation; a stale generation or a prefix whose digest differs from
the STEP's ``prefix_digest`` is refused with a reason, never drafted after.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pp1q.core.errors import Reason
from pp1q.core.prefix import Prefix

MAX_SESSIONS_TRACKED = 64  # verifier connections one worker serves; bounds this table


class StateRefusedError(Exception):
    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass
class SlotState:
    generation: int
    prefix: Prefix
    pending_round: int | None = None  # round whose drafts await COMMIT
    pending_drafts: list[int] = field(default_factory=list)


class WorkerState:
    def __init__(self) -> None:
        self._slots: dict[tuple[int, int], SlotState] = {}
        self._sessions: set[int] = set()

    # -- sessions ------------------------------------------------------------

    def open_session(self, session: int) -> None:
        if len(self._sessions) >= MAX_SESSIONS_TRACKED:
            raise StateRefusedError(Reason.TOO_MANY_INFLIGHT, "too many verifier sessions")
        self._sessions.add(session)

    def close_session(self, session: int) -> None:
        """A connection ended: every key and prefix under its session is dead."""
        self._sessions.discard(session)
        for key in [k for k in self._slots if k[0] == session]:
            del self._slots[key]

    def slots_held(self) -> int:
        """Slots with a live context (the worker's slots-in-use gauge)."""
        return len(self._slots)

    # -- inputs --------------------------------------------------------------

    def set_context(self, session: int, slot: int, generation: int, tokens, digest: int) -> Prefix:
        if session not in self._sessions:
            raise StateRefusedError(Reason.STATE_NOT_ALLOWED, "no live wire session with this id")
        old = self._slots.get((session, slot))
        if old is not None and generation <= old.generation:
            raise StateRefusedError(Reason.STALE_GENERATION,
                               f"context for generation {generation} <= {old.generation}")
        prefix = Prefix(tokens)
        if prefix.digest != digest:
            raise StateRefusedError(Reason.CHECKSUM_MISMATCH, "context digest")
        self._slots[(session, slot)] = SlotState(generation, prefix)
        return prefix

    def prefix_for_step(self, session: int, slot: int, generation: int, last_committed: int,
                        digest: int) -> Prefix:
        st = self._slots.get((session, slot))
        if st is None or st.generation != generation:
            raise StateRefusedError(Reason.STALE_GENERATION, "no context for this generation")
        if st.prefix.last_position != last_committed:
            raise StateRefusedError(Reason.BAD_POSITION, f"last_committed {last_committed}"
                                    f" != committed {st.prefix.last_position}")
        if st.prefix.digest != digest:
            raise StateRefusedError(Reason.CHECKSUM_MISMATCH, "prefix digest differs")
        return st.prefix

    def drafted(self, session: int, slot: int, generation: int, round_id: int,
                drafts: list[int]) -> None:
        st = self._slots.get((session, slot))
        if st is not None and st.generation == generation:
            st.pending_round, st.pending_drafts = round_id, list(drafts)

    def commit(self, session: int, slot: int, generation: int, round_id: int, accepted: int,
               token: int, committed: int) -> None:
        st = self._slots.get((session, slot))
        if st is None or st.generation != generation or st.pending_round != round_id:
            raise StateRefusedError(Reason.STALE_GENERATION, "commit for an unknown round")
        if not 0 <= accepted <= len(st.pending_drafts):
            raise StateRefusedError(Reason.BAD_POSITION, f"accepted {accepted}")
        new = st.pending_drafts[:accepted] + [token]
        if st.prefix.last_position + len(new) != committed:
            raise StateRefusedError(Reason.BAD_POSITION, f"committed position {committed}")
        st.prefix.extend(new)
        st.pending_round, st.pending_drafts = None, []

    def reset(self, session: int, slot: int, generation: int) -> None:
        """Generations <= ``generation`` of the slot are dead (a newer context survives)."""
        st = self._slots.get((session, slot))
        if st is not None and st.generation <= generation:
            del self._slots[(session, slot)]
