"""The OpenAI Stopper follows the text in a window (pp1q.verifier.detokenize): the same
deltas, end and answer as decoding every id each round (stopper_cases' oracle) on random
ids in random rounds, for the toy's IdText and byte-level and SentencePiece-like decoders
(characters whose bytes span tokens: CJK, emoji); today's deltas for a decode that is not
prefix-stable; O(ids) decoded per request; and a window that is wrong is caught."""

from __future__ import annotations

import random

import pytest
from stopper_cases import (
    CountingDecoder,
    FullDecodeStopper,
    call,
    check_equivalent,
    random_rounds,
    run,
)

from pp1q.verifier.detokenize import IncrementalText
from pp1q.verifier.openai_api import IdText, Stopper

CORPUS = ("Le café 😀 et 東京 🙂, ok. Ünïcödé ₿ 𝄞 naïve — “quotes” 한국어 don't it's a , b . "
          "The quick brown fox! Is it? 🇫🇷 👩‍👩‍👧 e\u0301")
SPECIAL = 3  # ids 0..2 decode to nothing (skip_special_tokens)


class ByteBPE:
    """A byte-level BPE's decode: each id some bytes (pieces of CORPUS cut at random
    byte offsets, the lone bytes of its characters, a few specials of no text), the run
    decoded as UTF-8 with U+FFFD for what is not (yet) a character."""

    def __init__(self, seed: int = 0, corpus: str = CORPUS) -> None:
        rng = random.Random(seed)
        raw = corpus.encode()
        pieces = {b""} | {bytes([b]) for b in raw}
        for _ in range(300):
            i = rng.randrange(len(raw))
            pieces.add(raw[i:i + rng.randint(1, 6)])
        self.pieces = [b""] * SPECIAL + sorted(pieces - {b""})

    @property
    def vocab(self) -> int:
        return len(self.pieces)

    def _bytes(self, ids) -> bytes:
        return b"".join(self.pieces[i] for i in ids)

    def decode(self, ids) -> str:
        return self._bytes(ids).decode("utf-8", errors="replace")


class SentencePieceLike(ByteBPE):
    """SentencePiece's decode: "▁" is a space, and the text's first space is dropped (a
    decode of ids from the middle drops the space its first word began with)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed, CORPUS.replace(" ", "▁"))

    def decode(self, ids) -> str:
        return super().decode(ids).replace("▁", " ").removeprefix(" ")


class CleanUp(ByteBPE):
    """HF's clean_up_tokenization_spaces: " ." becomes "." once the "." comes, so the
    decode is not prefix-stable (the text of the ids before a "." loses its space)."""

    def decode(self, ids) -> str:
        text = super().decode(ids)
        for s in (" .", " ?", " !", " ,", " n't", " 's"):
            text = text.replace(s, s[1:])
        return text


def _case(rng: random.Random, text, n_max: int = 160):
    vocab = text.vocab if hasattr(text, "vocab") else 50
    ids = [rng.randrange(vocab) for _ in range(rng.randint(1, n_max))]
    whole = text.decode(ids)
    stops: tuple[str, ...] = ()
    kind = rng.randrange(4)
    if kind == 1 and whole:  # a piece of the text: it stops, mostly
        stops = tuple({whole[i:i + rng.randint(1, 4)]
                       for i in (rng.randrange(len(whole)) for _ in range(rng.randint(1, 3)))})
    elif kind == 2:
        stops = ("zz#never", "東京", "😀")
    elif kind == 3:
        stops = ("\ufffd",)  # what a character's first bytes show: matched where today's is
    stop_ids = (rng.randrange(vocab),) if rng.random() < 0.2 else ()
    return random_rounds(rng, ids, biggest=rng.choice([1, 3, 17])), stops, stop_ids


@pytest.mark.parametrize("make", [IdText, ByteBPE, SentencePieceLike],
                         ids=["idtext", "byte-bpe", "sentencepiece"])
def test_the_window_gives_the_whole_decodes_deltas_and_answer(make):
    rng = random.Random(53)
    for _ in range(150):
        rounds, stops, stop_ids = _case(rng, make())
        assert check_equivalent(make(), rounds, stops, stop_ids)  # in the window throughout


def test_a_decode_that_is_not_prefix_stable_keeps_todays_deltas():
    """clean_up_tokenization_spaces changes text the window had settled: the request goes
    on decoding every id, giving today's deltas (which do not make up the answer there)."""
    rng, fell_back = random.Random(7), 0
    for _ in range(150):
        rounds, stops, stop_ids = _case(rng, CleanUp())
        fell_back += not check_equivalent(CleanUp(), rounds, stops, stop_ids,
                                          prefix_stable=False)
    assert fell_back > 10  # the window did meet " ." and the like (else this shows nothing)


def test_stalled_windows_and_runs_of_split_characters():
    """Ids that decode to nothing, a character's bytes one id each, lone lead bytes: the
    window waits (or gives up for a full decode past MAX_STALLED) with today's text."""
    tok = ByteBPE()
    lead, = (i for i, p in enumerate(tok.pieces) if p == "😀".encode()[:1])
    rest = [tok.pieces.index(bytes([b])) for b in "😀".encode()[1:]]
    word = tok.pieces.index(b"o")
    for ids, stalls in (([0, 1, 2] * 30 + [word] * 5, True), ([lead] + rest + [word], False),
                        ([lead, word] * 80, False), ([lead] * 100 + rest, True),
                        ([word, 0] * 50 + [lead], False)):
        for biggest in (1, 2, 5):
            rounds = random_rounds(random.Random(biggest), ids, biggest)
            for stops in ((), ("o",), ("\ufffdo",), ("oo",)):
                followed = check_equivalent(tok, rounds, stops)
                assert followed != stalls, (ids, stops)  # MAX_STALLED: a whole decode


@pytest.mark.parametrize("make", [IdText, ByteBPE], ids=["idtext", "byte-bpe"])
@pytest.mark.parametrize("biggest", [1, 6])
def test_a_request_decodes_o_of_its_ids(make, biggest):
    """2,000 ids, a stop string that never comes, streamed: the window decodes each id a
    few times (< 8n in all, the answer's whole decode included); every id each round
    was ~n^2/2 (n / biggest rounds)."""
    n = 2000
    rng = random.Random(biggest)
    ids = [rng.randrange(SPECIAL, getattr(make(), "vocab", 50)) for _ in range(n)]
    rounds = random_rounds(rng, ids, biggest)
    counted = {}
    paths = [("window", Stopper)] + [("whole", FullDecodeStopper)] * (make is IdText)
    for name, stopper in paths:
        text = CountingDecoder(make())
        deltas, answer, _, _ = run(stopper(call(["zz#never"]), text), rounds)
        assert "".join(deltas) == answer == make().decode(ids)
        counted[name] = text.ids
    assert counted["window"] < 8 * n, counted
    if "whole" in counted:  # what the window saves (the toy's decode is the quicker)
        assert counted["whole"] > n * n / (2 * biggest) * 0.8, counted


class NotLocal(ByteBPE):
    """Prefix-stable but not local: every fifth character of the whole text upper-cased
    (a window's text counts from the window's start)."""

    def decode(self, ids) -> str:
        return "".join(c.upper() if i % 5 == 0 else c
                       for i, c in enumerate(super().decode(ids)))


def test_a_decode_the_window_cannot_follow_is_caught():
    """The window's text passes its own checks and differs from the whole decode: the
    cross-check rejects the stream; the answer is still the whole decode, and later
    Stoppers on that decoder decode in full (today's deltas)."""
    tok, rng = NotLocal(), random.Random(3)
    rounds = random_rounds(rng, [rng.randrange(SPECIAL, tok.vocab) for _ in range(120)], 3)
    with pytest.raises(AssertionError):
        check_equivalent(tok, rounds)
    _, answer, _, ids = run(Stopper(call(), NotLocal()), rounds)
    assert answer == tok.decode(ids)
    check_equivalent(tok, rounds)  # the same decoder: remembered


class Contextless(IncrementalText):
    """A planted bug: each window decoded from its new ids alone, without the ids
    before them (what the window's ``prefix`` is for)."""

    def update(self, ids):
        self._prefix, self._prefix_text = self._read, ""
        return super().update(ids)


class ContextlessStopper(Stopper):
    def __init__(self, call, text) -> None:
        super().__init__(call, text)
        self._inc = Contextless(text)


def test_the_cross_check_rejects_a_window_without_context():
    """SentencePiece drops the space a window's first word begins with: without the ids
    before, the window's text loses spaces. (A byte-level decode needs no context where
    the window settles, at a whole character: there the bug would change nothing.)"""
    rng = random.Random(11)
    with pytest.raises(AssertionError):
        for _ in range(50):
            rounds, stops, stop_ids = _case(rng, SentencePieceLike())
            check_equivalent(SentencePieceLike(), rounds, stops, stop_ids,
                             stopper=ContextlessStopper)


class Utf8Bytes:
    """A decode of one byte an id (ids under 256), U+FFFD for an unfinished character."""

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


@pytest.mark.parametrize("stopper", [Stopper, FullDecodeStopper], ids=["window", "oracle"])
def test_a_stop_string_ending_in_an_unfinished_character_is_never_streamed(stopper):
    """'c😀' with the emoji's four bytes still to come: 'c' was streamed (held back from
    the end of the text, U+FFFD included, not from the end of its settled part), and the
    answer ended before it. Found by review on SmolLM2's tokenizer (' 🍵')."""
    ids = list(b"abc") + list("😀".encode())
    deltas, answer, stopped, _ = run(stopper(call(["c😀"]), Utf8Bytes()), [[i] for i in ids])
    assert stopped and answer == "ab"
    assert "".join(deltas) == answer


@pytest.mark.parametrize("stopper", [Stopper, FullDecodeStopper], ids=["window", "oracle"])
def test_a_stop_string_before_a_stop_id_in_the_same_round_ends_the_answer(stopper):
    """A round commits up to 17 ids: the answer must not depend on where rounds split."""
    ids = list(b"xab") + [999]
    answers = {run(stopper(call(["ab"], [999]), Utf8Bytes()), rounds, stream)[1]
               for rounds in ([ids], [ids[:3], ids[3:]], [[i] for i in ids])
               for stream in (True, False)}
    assert answers == {"x"}
