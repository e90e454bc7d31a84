"""Incremental detokenization: the text of a growing list of token ids, decoding only a
window of recent ids at each step (after vLLM's ``detokenize_incrementally``), so that
following a whole answer costs O(its ids), not O(ids^2) as decoding them all each round.

The text of the ids before ``read`` is kept; the window is ``ids[prefix:]``, where
``prefix`` is the ``read`` of the step before. The window's text less the text of
``ids[prefix:read]`` is what the new ids add: decoding from ``prefix`` (not from
``read``) gives the tokenizer the context a lone token lacks (SentencePiece drops a
leading space at the start of a decode; byte-level BPE needs a character's earlier
bytes). While the window's text ends in U+FFFD (a character whose last bytes have not
come) or adds nothing (ids that decode to nothing), ``read`` stays where it is and the
window grows.

This equals the whole decode only for a decode that is local (a token's text depends on
the few before it, nothing further back) and prefix-stable (more ids never change the
text of the ones before, but for a trailing U+FFFD). ``update`` refuses what breaks
that within the window, so the caller can decode in full instead: a window whose text
does not begin with the text of its first ids (``clean_up_tokenization_spaces``
turning " ." into "." once the "." comes), a window whose text no longer begins with
what it had already settled, and a window stalled on more than ``MAX_STALLED`` ids it had
already decoded (ids that decode to nothing or to unfinished characters for that long:
garbage; a whole decode each step from then on, today's cost, rather than a window as
long as the answer). A decode that depends on text further back than the window passes these
checks: the caller compares ``whole()`` with one whole decode at the end.
"""

from __future__ import annotations

import contextlib
import weakref
from bisect import bisect_right
from typing import Protocol

# what a byte-level tokenizer decodes a character's first bytes to, until its last token
# comes: the text ending in it is not yet the text the whole answer will have there
REPLACEMENT = "\ufffd"
# ids a window re-decodes without settling them before it counts as stalled (a character
# spans 4 tokens at most; a round commits 17 at most, and a round's own ids are not counted)
MAX_STALLED = 64


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


_UNFOLLOWED: weakref.WeakSet = weakref.WeakSet()  # decoders a window followed wrongly


def followable(text: Decoder) -> bool:
    """False for a decoder whose whole decode once differed from its window's text."""
    try:
        return text not in _UNFOLLOWED
    except TypeError:  # not weakly referable or not hashable: never remembered
        return True


def unfollowed(text: Decoder) -> None:
    with contextlib.suppress(TypeError):
        _UNFOLLOWED.add(text)


class IncrementalText:
    """The text of ``ids[:n]``: ``committed`` characters settled (kept as pieces, each
    joined once) and a ``tail`` still open (the window's text past its settled part)."""

    def __init__(self, text: Decoder) -> None:
        self.text = text
        self.n = 0  # ids followed so far
        self.committed = 0  # characters settled: the text of ids[:read]
        self.tail = ""
        self._pieces: list[str] = []
        self._starts: list[int] = []  # where each piece begins in the text
        self._prefix = self._read = 0
        self._prefix_text = ""  # the text of ids[prefix:read] decoded alone

    def __len__(self) -> int:
        return self.committed + len(self.tail)

    def update(self, ids: list[int]) -> bool:
        """Follow ``ids`` (the ids of the last update and more after them); False when
        their text cannot be followed in a window (see the module's docstring), and
        this object is not to be used again."""
        if len(ids) == self.n:
            return True
        seen, self.n = self.n, len(ids)
        window = self.text.decode(ids[self._prefix:])
        if not window.startswith(self._prefix_text):
            return False
        tail = window[len(self._prefix_text):]
        if not tail.startswith(self.tail.rstrip(REPLACEMENT)):
            return False  # text this window had settled changed
        if tail and not tail.endswith(REPLACEMENT):
            self._starts.append(self.committed)
            self._pieces.append(tail)
            self.committed += len(tail)
            self._prefix, self._read, self.tail = self._read, len(ids), ""
            self._prefix_text = self.text.decode(ids[self._prefix:self._read])
            return True
        self.tail = tail
        return seen - self._read <= MAX_STALLED

    def since(self, pos: int) -> str:
        """The text from character ``pos`` on (O(its length) for a ``pos`` near the end)."""
        if pos >= self.committed:
            return self.tail[pos - self.committed:]
        i = bisect_right(self._starts, pos) - 1
        return "".join(self._pieces[i:])[pos - self._starts[i]:] + self.tail

    def whole(self) -> str:
        return self.since(0)
