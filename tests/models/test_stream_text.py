"""Streamed text on the real tokenizer (SmolLM2's byte-level BPE): characters whose bytes
span tokens (CJK, emoji) stream whole, never as U+FFFD, and the deltas of one-token rounds
concatenate to the whole answer's text; the Stopper's window (pp1q.verifier.detokenize)
gives the deltas and answer of decoding every id each round, decoding O(ids)."""

from __future__ import annotations

import random

import pytest
from stopper_cases import CountingDecoder, call, check_equivalent, random_rounds, run

from pp1q.models.text import TextCodec
from pp1q.verifier.openai_api import Stopper
from pp1q.verifier.openai_request import decode_call

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


def _pool(codec, vocab: int, rng) -> list[int]:
    """Ids to draw from: the ids of CJK and emoji text (bytes that span tokens), the
    specials (no text with skip_special_tokens), any id of the vocabulary."""
    text = TEXT + " 한국어 🇫🇷 👩‍👩‍👧 𝄞 naïve — “quoted” it's , . !"
    return codec.encode(text) + sorted(codec.eos_ids) + [rng.randrange(vocab) for _ in range(60)]


def test_the_window_gives_the_whole_decodes_deltas_and_answer(smol):
    """SmolLM2's tokenizer, random ids in random rounds, stop strings from the text: the
    Stopper's windowed text gives the same deltas, end and answer as decoding every id
    each round (stopper_cases' oracle)."""
    codec, rng = TextCodec(smol.tokenizer), random.Random(53)
    pool = _pool(codec, smol.vocab, rng)
    for _ in range(60):
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 300))]
        whole = codec.decode(ids)
        stops = ()
        if whole and rng.random() < 0.5:
            i = rng.randrange(len(whole))
            stops = (whole[i:i + rng.randint(1, 3)], "東京")
        rounds = random_rounds(rng, ids, rng.choice([1, 4, 17]))
        assert check_equivalent(codec, rounds, stops)  # in the window throughout


def test_a_request_decodes_o_of_its_ids_on_the_real_tokenizer(smol):
    n, rng = 2000, random.Random(1)
    codec = TextCodec(smol.tokenizer)
    pool = _pool(codec, smol.vocab, rng)
    ids = [rng.choice(pool) for _ in range(n)]
    text = CountingDecoder(codec)
    deltas, answer, _, _ = run(Stopper(call(["zz#never"]), text), random_rounds(rng, ids, 1))
    assert "".join(deltas) == answer == codec.decode(ids)
    assert text.ids < 8 * n  # decoding every id each round: ~n^2/2
