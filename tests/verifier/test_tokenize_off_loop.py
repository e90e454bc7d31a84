"""A real target's tokenizer runs off the event loop: while one request's text prompt is
being tokenized (here: held), /healthz and the rest of the verifier still answer, and
the request is served once its tokens are in."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from fake_decider import FakeDecider
from fake_worker import FakeWorker
from link_harness import WAIT_S, linked
from wire_helpers import config

from pp1q.models.text import TextCodec
from pp1q.runtime.metrics import Metrics
from pp1q.runtime.settings import VerifierSettings
from pp1q.verifier.daemon import routes
from pp1q.verifier.scheduler import Scheduler
from pp1q.verifier.server import HttpServer

pytestmark = pytest.mark.daemons  # binds servers on 127.0.0.1

HOLD_S = 5.0  # the tokenizer's hold when nobody lets it go (the loop blocked in it)


class HeldTokenizer:
    """transformers' shape for what TextCodec uses; encoding waits for ``go``."""

    eos_token_id = None
    chat_template = None

    def __init__(self) -> None:
        self.go, self.inside = threading.Event(), threading.Event()

    def __call__(self, text):
        self.inside.set()
        self.go.wait(HOLD_S)
        self.inside.clear()
        return {"input_ids": [1, 2, 3]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f" {i}" for i in ids)


async def _request(port: int, head: str, body: bytes = b"") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode() + body)
    raw = await asyncio.wait_for(reader.read(), WAIT_S)
    writer.close()
    status, _, rest = raw.partition(b"\r\n\r\n")
    return int(status.split(b" ")[1]), rest


async def test_healthz_answers_while_a_prompt_is_tokenized():
    tok, metrics = HeldTokenizer(), Metrics("verifier")
    async with linked(FakeWorker(), metrics) as link:
        scheduler = Scheduler(link, FakeDecider(), metrics, slots=1, depth=3,
                              text=TextCodec(tok))
        http = HttpServer(routes(VerifierSettings(), link, scheduler, config(versions=(2,))))
        try:
            port = await http.start("127.0.0.1", 0)
            assert await link.wait_ready(WAIT_S)
            body = json.dumps({"prompt": "some text", "max_tokens": 2, "temperature": 0}
                              ).encode()
            completion = asyncio.ensure_future(_request(
                port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n",
                body))
            for _ in range(int(WAIT_S / 0.01)):  # bounded: until the tokenizer holds
                if tok.inside.is_set():
                    break
                await asyncio.sleep(0.01)
            assert tok.inside.is_set(), "the prompt was not being tokenized"
            status, _ = await _request(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                             "Connection: close\r\n\r\n")
            assert status == 200
            assert tok.inside.is_set()  # answered while the prompt was being tokenized
            tok.go.set()
            status, answer = await asyncio.wait_for(completion, WAIT_S)
            assert status == 200 and json.loads(answer)["usage"]["prompt_tokens"] == 3
        finally:
            tok.go.set()
            await http.close()
