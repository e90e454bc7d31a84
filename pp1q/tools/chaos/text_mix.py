"""The real-model soak's text requests (pp1q.tools.chaos.real_soak): a prompt of a few
sentences, short or past one 128-id prefill chunk, streamed back through the verifier's
incremental detokenizer, and half of them with a stop string, which ends the answer's
text before it (and its ids at the token completing it)."""

from __future__ import annotations

import random
from dataclasses import dataclass

STOP_P = 0.5  # of the text requests: a stop string ends it where it completes
TEXTS = (
    "The lighthouse keeper climbed the narrow stairs every evening at dusk.",
    "She counted the ships that passed the harbour and wrote their names in a book.",
    "In the winter the storms came from the north and the waves broke over the pier.",
    "Nobody in the village remembered who had built the lighthouse, or when.",
    "A small boy asked her once why she never left the island.",
    "She told him that somebody had to keep the light burning for the sailors.",
    "Years later he came back as a captain, and his ship passed the rocks safely.",
    "Here is a recipe for bread: flour, water, salt and a little yeast.",
    "Mix them, knead the dough for ten minutes, and let it rise for an hour.",
    "Question: what is the capital of France?\nAnswer:",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Write a short poem about the sea, the wind and the stars.",
)
STOPS = ("\n", ".", " the", ",")


@dataclass(frozen=True)
class TextRequest:
    text: str
    stop: str | None  # a stop string: the answer's text ends before it


def draw_text(rng: random.Random) -> TextRequest:
    """A text prompt of 1..len(TEXTS) consecutive sentences (the longest past one prefill
    chunk), and a stop string or none."""
    start, count = rng.randrange(len(TEXTS)), rng.randint(1, len(TEXTS))
    text = " ".join(TEXTS[(start + i) % len(TEXTS)] for i in range(count))
    return TextRequest(text, rng.choice(STOPS) if rng.random() < STOP_P else None)
