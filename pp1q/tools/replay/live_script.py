"""A capture as the steps of a live replay, in record order (sans-IO).

``script(role, records)`` yields what ``pp1q.tools.replay.live`` does next:
``Send`` a captured verifier frame (HELLO, CONTEXT, STEP, COMMIT, RESET: its exact
bytes), note a ``Captured`` worker answer, or ``Close`` a connection. Either side's
capture holds both directions, so either replays. The decoders are the replay's own
(``streams.StreamSet``), with its bounds: at most the reader's MAX_OPEN_CONNECTIONS
connections at once, each let go at its CLOSE.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pp1q.runtime.capture import Record, Role
from pp1q.tools.replay.answers import Answer, answer_of
from pp1q.tools.replay.streams import Flow, StreamSet
from pp1q.wire import Hello


@dataclass(frozen=True)
class Send:
    conn: int
    message: object
    raw: bytes  # the frame exactly as captured

    @property
    def opens(self) -> bool:
        """A HELLO: the live replay connects for it."""
        return isinstance(self.message, Hello)


@dataclass(frozen=True)
class Captured:
    conn: int
    answer: Answer


@dataclass(frozen=True)
class Close:
    conn: int


@dataclass(frozen=True)
class Broken:
    """A captured stream that stops decoding: nothing after it can be replayed."""

    conn: int
    flow: Flow
    what: str


Action = Send | Captured | Close | Broken


def script(role: Role, records: Iterable[Record]) -> Iterator[Action]:
    streams = StreamSet(role)
    for rec in records:
        for item in streams.items(rec):
            if item.what == "close":
                yield Close(item.conn)
            elif item.what == "error":
                yield Broken(item.conn, item.flow, f"the captured {item.flow} stream does not "
                             f"decode (record {rec.index} at byte {rec.offset}): {item.error}")
            elif item.what != "frame":
                continue  # open (a live connection opens at its HELLO), info, raw bytes
            elif item.flow is Flow.TO_WORKER:
                yield Send(item.conn, item.message, item.raw)
            else:
                yield Captured(item.conn, answer_of(item.frame))


__all__ = ["Action", "Broken", "Captured", "Close", "Send", "script"]
