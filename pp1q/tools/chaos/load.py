"""The soak's load: ``concurrency`` client threads, each sending requests until told to
stop, and leaving some of them (pp1q.tools.chaos.leave).

A request read to its end must come back whole; one that takes ``hang_s`` (the clients'
socket timeout: a plain answer comes at once at its end, so that bounds the whole
request) is counted as hung, not failed: a request the verifier no longer moves. Each
thread draws its requests from one generator and its leaving from another (its own
domain), so a soak that leaves nothing sends the very mix it sent before leaving existed.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Protocol
from urllib.parse import urlsplit

from pp1q.tools.chaos import leave
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
                prompt = [rng.randrange(cfg.vocab) for _ in range(rng.randint(2, 16))]
                n = rng.randint(4, 48)
                top_k = rng.choice(cfg.top_ks)
                seed = rng.getrandbits(64)
                plan = leave.draw(leaving, cfg.abandon_p)
                if plan is None:
                    self._one(client, prompt, n, seed, top_k)
                else:
                    self._leave(plan, prompt, n, seed, top_k)
        finally:
            client.close()

    def _one(self, client: Client, prompt: list[int], n: int, seed: int, top_k) -> None:
        t0 = time.monotonic()
        try:
            a = client.generate(prompt, n, seed=seed, top_k=top_k)
        except ApiError as e:
            elapsed = time.monotonic() - t0
            with self.lock:
                if elapsed >= self.cfg.hang_s:
                    self.hung.append(f"a request read to its end: {elapsed:.0f} s, {e}")
                else:
                    self.failed.append(str(e))
            return
        with self.lock:
            if len(a["token_ids"]) != n:
                self.failed.append(f"{len(a['token_ids'])} tokens, asked {n}")
            self.requests += 1
            self.tokens += len(a["token_ids"])
            self.slowest_s = max(self.slowest_s, time.monotonic() - t0)

    def _leave(self, plan: leave.Plan, prompt: list[int], n: int, seed: int, top_k) -> None:
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
