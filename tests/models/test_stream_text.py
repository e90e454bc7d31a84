"""Streamed text on the real tokenizer (SmolLM2's byte-level BPE): characters whose bytes
span tokens (CJK, emoji) stream whole, never as U+FFFD, and the deltas of one-token rounds
concatenate to the whole answer's text."""

from __future__ import annotations

import pytest

from pp1q.models.text import TextCodec
from pp1q.verifier.openai_api import Stopper, decode_call

pytestmark = pytest.mark.model

TEXT = "Le café 😀 et 東京 🙂, ok"


def test_one_token_rounds_stream_every_character_whole(smol):
    codec = TextCodec(smol.tokenizer)
    ids = codec.encode(TEXT, chat=False)
    partial = [n for n in range(1, len(ids)) if "\ufffd" in codec.decode(ids[:n])]
    assert partial  # the text does split characters across tokens (else this shows nothing)
    call = decode_call(b'{"prompt": [1]}', chat=False, tokenizer=None, model_id="m",
                       vocab=smol.vocab, default_top_k=None, max_support=smol.vocab)
    s = Stopper(call, codec)
    deltas = []
    for i, t in enumerate(ids):
        s.feed([t])
        deltas.append(s.delta(final=i == len(ids) - 1))
    assert "".join(deltas) == s.full_text() == codec.decode(ids)
    assert not any("\ufffd" in d for d in deltas)
