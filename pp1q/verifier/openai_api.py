"""The OpenAI-shaped API's answers: where the output stops (Stopper), answers and
server-sent-event chunks (no I/O here; pp1q.verifier.openai_routes serves,
pp1q.verifier.openai_request decodes the requests).

A target without a tokenizer (the toy) renders each token as `` <id>`` (``IdText``).
Every choice also carries the ``token_ids`` it produced.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import msgspec

from pp1q.runtime.settings import MAX_DEPTH
from pp1q.verifier.detokenize import REPLACEMENT, IncrementalText, followable, unfollowed
from pp1q.verifier.openai_request import Call, Tokenizer

# the ids one round commits at most (depth + 1); a stop string found only in the
# answer's whole decode ends the ids within this many of its end
MAX_ROUND_IDS = MAX_DEPTH + 1


class IdText:
    """Text of a target without a tokenizer: each token as `` <id>`` (deltas concatenate
    to the whole text, as a real tokenizer's do)."""

    @staticmethod
    def decode(ids: list[int]) -> str:
        return "".join(f" {t}" for t in ids)


def _first(text: str, stops: tuple[str, ...]) -> int | None:
    return min((i for i in (text.find(s) for s in stops) if i >= 0), default=None)


class Stopper:
    """Where the output ends: at the first stop token id (excluded, as vLLM's
    stop_token_ids) or stop string (excluded, as OpenAI's); holds back the text that could
    still become a stop string, or the rest of a character split across tokens, so a
    stream never shows what the whole answer does not.

    Cost: the text is followed in a window (pp1q.verifier.detokenize: each round decodes
    its new ids and the few before them) and stop strings are looked for only where a
    new one could be (the last ``len(longest stop) - 1`` settled characters and the new
    text), so a request costs O(its ids), where decoding every id each round cost
    O(ids^2) (3.66 CPU-s for 4,096 tokens with a stop string on SmolLM2's tokenizer).
    The answer's text is one whole decode at the end, as before, cut at the stop string.

    Exactness: the window's text is the whole decode's for a local, prefix-stable decode
    (byte-level BPE, SentencePiece, the toy's ``IdText``). A decode that is not (HF's
    ``clean_up_tokenization_spaces``) is caught in the window, and the request goes on
    decoding every id each round: today's path, with today's text and deltas from that
    round on. One that depends on text further back than the window (no tokenizer we
    know) is caught when the answer's whole decode differs from the window's text: the
    answer is the whole decode's (its stop string looked for there; its stream may have
    shown the window's text, and its ids end no earlier than those the stream handed
    out), and every later Stopper on that decoder decodes in full.
    """

    def __init__(self, call: Call, text: Tokenizer | IdText) -> None:
        self.stop_ids, self.stop_strs, self.text = call.stop_ids, call.stop_strs, text
        self.ids: list[int] = []
        self.shown = 0  # characters of the text already handed out
        self._ids_out = 0  # ids already handed out (a stream's chunks): never taken back
        self.stopped = False
        self._cut: int | None = None  # end of the text when a stop string matched
        self._longest = max(map(len, self.stop_strs), default=0)
        # the text followed in a window; None: every id decoded each round
        self._inc: IncrementalText | None = IncrementalText(text) if followable(text) else None
        self._searched = 0  # settled characters looked through for stop strings
        # the whole decode of the first ``_decoded`` ids (ids only grow: a count names them)
        self._decoded, self._text = 0, ""
        self._checked = 0  # ids whose whole decode was compared with the window's text

    def _decode(self) -> str:
        if self._decoded != len(self.ids):
            self._decoded, self._text = len(self.ids), self.text.decode(self.ids)
        return self._text

    def _follow(self) -> IncrementalText | None:
        """The window's text up to date, or None from the round the window could not
        follow (decoded in full from then on)."""
        if self._inc is not None and not self._inc.update(self.ids):
            self._inc = None
        return self._inc

    def feed(self, new: list[int]) -> bool:
        """Take a round's committed tokens; True when the output ended in them."""
        before = len(self.ids)
        stop_id = False
        for t in new:
            if t in self.stop_ids:
                stop_id = True  # the ids before it may still hold a stop string: look
                break
            self.ids.append(t)
        self.stopped = self.stopped or stop_id
        if self.stop_strs and self._cut is None:
            inc = self._follow()
            if inc is None:
                start, text = 0, self._decode()
            else:  # a stop string ending in settled text was found when that was new
                start = max(0, self._searched - (self._longest - 1))
                text, self._searched = inc.since(start), inc.committed
            hit = _first(text, self.stop_strs)
            if hit is not None:
                self._cut, self.stopped = start + hit, True
                self._end_ids(before)
        return self.stopped

    def _end_ids(self, clear: int) -> None:
        """Drop the ids after the first one past ``clear`` whose text holds a stop string
        (a round commits several; target-only sampling would have ended there, so the
        answer's ids and usage do not depend on where the rounds fell). Once per request,
        a whole decode per id of the last round (17 at most). The window that followed
        the dropped ids is no longer compared with the answer (``full_text``)."""
        end = next((k for k in range(clear + 1, len(self.ids))
                    if _first(self.text.decode(self.ids[:k]), self.stop_strs) is not None),
                   len(self.ids))
        if end < len(self.ids):
            del self.ids[end:]
            self._cut = _first(self._decode(), self.stop_strs)

    def full_text(self) -> str:
        """The answer's text: the whole decode, cut at the stop string (checked against
        the window's text the first time for these ids)."""
        full = self._decode()
        if self._checked != len(self.ids):
            self._checked = len(self.ids)
            inc = self._inc
            # (a window that followed ids since dropped at a stop string is not compared)
            if (inc is not None and 0 < inc.n <= len(self.ids) and self._follow() is not None
                    and inc.whole() != full):
                self._unfollowed(full)
        return full[: self._cut]

    def _unfollowed(self, full: str) -> None:
        unfollowed(self.text)  # later requests decode in full from the start
        self._inc = None
        if self.stop_strs:
            hit = _first(full, self.stop_strs)
            self._cut, self.stopped = hit, self.stopped or hit is not None
            if hit is not None:  # a decoder no window follows: no round is known, and
                # the ids a stream already handed out stay (its chunks add up to its usage)
                self._end_ids(max(0, self._ids_out - 1, len(self.ids) - MAX_ROUND_IDS))

    def take_ids(self) -> list[int]:
        """The answer's ids not yet handed out (after ``delta``, which may end them)."""
        out, self._ids_out = self.ids[self._ids_out:], len(self.ids)
        return out

    def delta(self, final: bool) -> str:
        """Text not yet handed out; before the end, less what a stop string could start
        and less a trailing character still undecoded (U+FFFD until its last byte)."""
        if final or self.stopped:
            full = self.full_text()
            out, self.shown = full[self.shown:], max(self.shown, len(full))
            return out
        inc = self._follow()
        rest = self._decode()[self.shown:] if inc is None else inc.since(self.shown)
        # an unfinished character may complete a stop string begun in the settled text
        # before it: hold back from where the settled text ends, not from the text's end
        end = self.shown + len(rest.rstrip(REPLACEMENT))
        if self.stop_strs:
            end -= self._longest - 1
        end = max(self.shown, end)
        out, self.shown = rest[: end - self.shown], end
        return out


def completion_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + os.urandom(12).hex()


def usage(call: Call, n_out: int) -> dict:
    n_in = len(call.req.prompt)
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


def extension(answer: dict) -> dict:
    """pp1q's statistics of one request (the ``pp1q`` field of an answer)."""
    return {"seed": answer["seed"], "stats": answer["stats"], "elapsed_s": answer["elapsed_s"]}


def _choice(chat: bool, text: str, ids: list[int], finish: str | None,
            message: dict | None = None) -> dict:
    """One choice; for chat, ``message`` is the delta of a stream's chunk."""
    if not chat:
        return {"index": 0, "text": text, "token_ids": ids, "logprobs": None,
                "finish_reason": finish}
    key, body = ("message", {"role": "assistant", "content": text}) if message is None else (
        "delta", message)
    return {"index": 0, key: body, "token_ids": ids, "logprobs": None, "finish_reason": finish}


@dataclass
class Shape:
    """The envelope every object of one answer shares."""

    chat: bool
    model: str
    id: str = ""
    created: int = 0
    # a chat stream's first chunk carries the role, the rest only content, as OpenAI's:
    # clients concatenate each delta's strings (openai's stream helper made a role in
    # every chunk "assistantassistant...")
    role_sent: bool = False

    def __post_init__(self) -> None:
        self.id = self.id or completion_id(self.chat)
        self.created = self.created or int(time.time())

    def _env(self, stream: bool) -> dict:
        obj = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if stream and self.chat else "")
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def answer(self, call: Call, stopper: Stopper, answer: dict) -> dict:
        text = stopper.full_text()  # first: it may find the stop (and end the ids) itself
        finish = "stop" if stopper.stopped else answer["finish_reason"]
        return {**self._env(False), "choices": [_choice(self.chat, text, stopper.ids, finish)],
            "usage": usage(call, len(stopper.ids)), "pp1q": extension(answer)}

    def chunk(self, text: str, ids: list[int], finish: str | None = None,
              answer: dict | None = None) -> dict:
        delta = {"content": text} if text or not self.role_sent else {}
        if not self.role_sent:
            delta, self.role_sent = {"role": "assistant", **delta}, True
        out = {**self._env(True), "choices": [_choice(self.chat, text, ids, finish, delta)]}
        if answer is not None:
            out["pp1q"] = extension(answer)
        return out

    def usage_chunk(self, call: Call, n_out: int) -> dict:
        return {**self._env(True), "choices": [], "usage": usage(call, n_out)}


def sse(obj: dict | str) -> bytes:
    """One server-sent event (``data: [DONE]`` ends a stream, as OpenAI's)."""
    data = obj if isinstance(obj, str) else msgspec.json.encode(obj).decode()
    return f"data: {data}\n\n".encode()
