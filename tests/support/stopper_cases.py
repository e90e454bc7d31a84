"""The OpenAI Stopper's cross-check: its windowed text against the whole-decode path.

``FullDecodeStopper`` is the Stopper as it was before the window (every id decoded each
round; the stop string looked for in the whole text), with the two fixes a review found
later (a stop string before a stop id of the same round; the hold-back measured from
the end of the settled text; the ids ending at the one that completed a stop string):
the oracle. ``check_equivalent``
feeds the same ids in the same rounds to both and asserts the same deltas round by
round, the same end and the same answer; ``CountingDecoder`` counts the ids a decoder is
given, passed as the Stopper's ``text`` as production passes the tokenizer.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

from pp1q.verifier.openai_api import Stopper

REPLACEMENT = "\ufffd"


def call(stop_strs=(), stop_ids=()):
    """What a Stopper reads of a decoded request."""
    return SimpleNamespace(stop_strs=tuple(stop_strs), stop_ids=frozenset(stop_ids))


class FullDecodeStopper:
    """The whole-decode path (pp1q's Stopper until the window): the oracle."""

    def __init__(self, call, text) -> None:
        self.stop_ids, self.stop_strs, self.text = call.stop_ids, call.stop_strs, text
        self.ids: list[int] = []
        self.shown, self.stopped, self._cut = 0, False, None
        self._decoded, self._text = 0, ""

    def _decode(self) -> str:
        if self._decoded != len(self.ids):
            self._decoded, self._text = len(self.ids), self.text.decode(self.ids)
        return self._text

    def feed(self, new):
        before = len(self.ids)
        for t in new:
            if t in self.stop_ids:
                self.stopped = True
                break
            self.ids.append(t)
        if self.stop_strs and self._cut is None:
            full = self._decode()
            if self._hit(full) is not None:
                # the ids end at the first one of this round whose text holds a stop string
                k = next(k for k in range(before + 1, len(self.ids) + 1)
                         if self._hit(self.text.decode(self.ids[:k])) is not None)
                del self.ids[k:]
                self._cut, self.stopped = self._hit(self._decode()), True
        return self.stopped

    def _hit(self, text: str) -> int | None:
        return min((i for i in (text.find(s) for s in self.stop_strs) if i >= 0), default=None)

    def full_text(self) -> str:
        return self._decode()[: self._cut]

    def delta(self, final: bool) -> str:
        full = self.full_text()
        end = len(full)
        if not final and not self.stopped:
            end = len(full.rstrip(REPLACEMENT))
            if self.stop_strs:
                end -= max(map(len, self.stop_strs)) - 1
            end = max(self.shown, end)
        out, self.shown = full[self.shown:end], max(self.shown, end)
        return out


class CountingDecoder:
    """``text`` with a count of the ids its ``decode`` was given."""

    def __init__(self, text) -> None:
        self.text, self.ids = text, 0

    def decode(self, ids):
        self.ids += len(ids)
        return self.text.decode(ids)


def run(stopper, rounds, stream: bool = True):
    """Feed ``rounds`` as the OpenAI routes do (a delta after each round when streamed,
    the last one final); the deltas, the answer's text, whether it stopped, its ids."""
    deltas = []
    for i, new in enumerate(rounds):
        stopped = stopper.feed(new)
        if stream:
            deltas.append(stopper.delta(final=stopped or i == len(rounds) - 1))
        if stopped:
            break
    return deltas, stopper.full_text(), stopper.stopped, list(stopper.ids)


def random_rounds(rng: random.Random, ids: list[int], biggest: int = 17) -> list[list[int]]:
    """``ids`` cut into rounds of 1..``biggest`` (a round commits depth + 1 at most)."""
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, biggest)
        out.append(ids[i:i + n])
        i += n
    return out


def check_equivalent(text, rounds, stop_strs=(), stop_ids=(), stopper=Stopper,
                     prefix_stable: bool = True) -> bool:
    """``stopper`` on ``text`` gives the oracle's deltas, end and answer, streamed and
    not; for a ``prefix_stable`` decode the deltas also make up the answer. True when
    the streamed request was followed in the window to its end (no whole decode each
    round from some round on), so a pass shows the window's text, not the fallback's."""
    followed = True
    for stream in (True, False):
        c = call(stop_strs, stop_ids)
        s = stopper(c, text)
        got = run(s, rounds, stream)
        want = run(FullDecodeStopper(c, text), rounds, stream)
        assert got == want, (stream, rounds, stop_strs)
        if stream:
            assert "".join(got[0]) == got[1] or not prefix_stable
            followed = s._inc is not None
    return followed
