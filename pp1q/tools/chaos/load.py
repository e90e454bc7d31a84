"""The soak's load: ``concurrency`` client threads, each sending requests until told to
stop, and leaving some of them (pp1q.tools.chaos.leave).

A request read to its end must come back whole; one that takes ``hang_s`` (the clients'
socket timeout: a plain answer comes at once at its end, so that bounds the whole
request) is counted as hung, not failed: a request the verifier no longer moves. Each
thread draws its requests from one generator and its leaving from another (its own
domain), so a soak that leaves nothing sends the very mix it sent before leaving existed.

On a real model (``model`` set) a request may come back short only where it says why,
``finish_reason`` "stop" (the target's EOS, or a stop string), and ``text_p`` of the
requests carry a text prompt (pp1q.tools.chaos.text_mix) and are streamed back from
/v1/completions: each must end with "length" and all its ids, or "stop", its text never
holding its stop string.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Protocol
from urllib.parse import urlsplit

from pp1q.tools.chaos import leave
from pp1q.tools.chaos.text_mix import TextRequest, draw_text
from pp1q.tools.client import ApiError, Client


class LoadConfig(Protocol):
    """What the load reads of the soak's SoakConfig (named here, not imported: the soak
    imports this module)."""

    seed: int
    concurrency: int
    vocab: int
    top_ks: tuple[int | None, ...]
    abandon_p: float
    hang_s: float
    model: tuple[str, ...]
    prompt_ids: tuple[int, int]
    max_tokens: tuple[int, int]
    text_p: float


class Load:
    def __init__(self, url: str, cfg: LoadConfig, stop: threading.Event) -> None:
        self.url, self.cfg, self.stop = url, cfg, stop
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port
        self.lock = threading.Lock()
        self.requests = self.tokens = 0
        self.failed: list[str] = []
        self.hung: list[str] = []
        self.left: Counter[str] = Counter()  # stage (leave.STAGES, leave.FINISHED) -> count
        self.left_speculative = 0
        self.texts = 0  # of the requests read to their end: text prompts, streamed
        self.stopped = 0  # ... and requests that ended early saying "stop" (a real model)
        self.slowest_s = 0.0  # of the requests read to their end
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(cfg.concurrency)]

    def _run(self, i: int) -> None:
        cfg = self.cfg
        rng = random.Random(cfg.seed * 1000 + i)
        leaving = random.Random(f"leave:{cfg.seed}:{i}")
        client = Client(self.url, timeout=cfg.hang_s)
        try:
            while not self.stop.is_set():
                prompt = [rng.randrange(cfg.vocab) for _ in range(rng.randint(*cfg.prompt_ids))]
                n = rng.randint(*cfg.max_tokens)
                top_k = rng.choice(cfg.top_ks)
                seed = rng.getrandbits(64)
                # drawn only where text_p is set: the toy's mix draws as it always did
                text = draw_text(rng) if cfg.text_p and rng.random() < cfg.text_p else None
                plan = leave.draw(leaving, cfg.abandon_p)
                if plan is None and text is not None:
                    self._text(client, text, n, seed, top_k)
                elif plan is None:
                    self._one(client, prompt, n, seed, top_k)
                else:
                    self._leave(plan, text.text if text else prompt, n, seed, top_k)
        finally:
            client.close()

    def _one(self, client: Client, prompt: list[int], n: int, seed: int, top_k) -> None:
        t0 = time.monotonic()
        try:
            a = client.generate(prompt, n, seed=seed, top_k=top_k)
        except ApiError as e:
            self._error(e, t0)
            return
        self._done(len(a["token_ids"]), n, a["finish_reason"], t0)

    def _text(self, client: Client, req: TextRequest, n: int, seed: int, top_k) -> None:
        """A text prompt streamed back from /v1/completions, with its stop string if any."""
        t0 = time.monotonic()
        body: dict = {"seed": leave.openai_seed(seed), "pp1q": leave.pp1q_ext(True, top_k)}
        if req.stop is not None:
            body["stop"] = [req.stop]
        ids, text, finish = [], "", None
        try:
            for event in client.stream(req.text, n, **body):
                choice = event["choices"][0]
                ids += choice["token_ids"]
                text += choice["text"]
                finish = choice["finish_reason"] or finish
        except ApiError as e:
            self._error(e, t0)
            return
        if req.stop is not None and req.stop in text:
            with self.lock:
                self.failed.append(f"stop string {req.stop!r} in the answer's text {text!r}")
        with self.lock:
            self.texts += 1
        self._done(len(ids), n, finish, t0)

    def _error(self, e: ApiError, t0: float) -> None:
        elapsed = time.monotonic() - t0
        with self.lock:
            if elapsed >= self.cfg.hang_s:
                self.hung.append(f"a request read to its end: {elapsed:.0f} s, {e}")
            else:
                self.failed.append(str(e))

    def _done(self, got: int, n: int, finish: str | None, t0: float) -> None:
        """A request read to its end: ``got`` ids of ``n`` asked, ending with ``finish``
        (a real model's may end early, saying "stop"; the toy's never do)."""
        stopped = bool(self.cfg.model) and finish == "stop" and got <= n
        with self.lock:
            if got != n and not stopped:
                self.failed.append(f"{got} tokens, asked {n} (finish_reason {finish})")
            self.stopped += got < n and stopped
            self.requests += 1
            self.tokens += got
            self.slowest_s = max(self.slowest_s, time.monotonic() - t0)

    def _leave(self, plan: leave.Plan, prompt: list[int] | str, n: int, seed: int, top_k) -> None:
        path, body = leave.body_of(plan, prompt, n, seed, top_k)
        try:
            stage = leave.leave(self.host, self.port, plan, path, body, self.cfg.hang_s)
        except leave.HungError as e:
            with self.lock:
                self.hung.append(str(e))
            return
        except OSError as e:  # the verifier refused the connection: it is never killed
            with self.lock:
                self.failed.append(f"a leaving client's request: {e}")
            return
        with self.lock:
            self.left[stage] += 1
            if stage != leave.FINISHED and plan.speculative:
                self.left_speculative += 1
