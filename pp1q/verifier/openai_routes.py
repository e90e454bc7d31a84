"""The OpenAI-shaped routes: /v1/completions, /v1/chat/completions (JSON or server-sent
events) and /v1/models, on the same Scheduler.generate as /v1/generate.

A streamed request runs Scheduler.generate as a task whose ``on_tokens`` callback wakes
the handler after each committed round; nothing is sent before the first tokens, so a
refusal before any (queue full, ranks lost) still gets its own status. The task is
cancelled whenever the handler ends (a disconnected client cancels the handler): the
scheduler's release path then frees the slot and RESETs the worker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiohttp import web

from pp1q.core.errors import ServiceError
from pp1q.verifier.api import GenerateRequest
from pp1q.verifier.http import INTERNAL, HttpError, as_http, error_body
from pp1q.verifier.openai_api import IdText, Shape, Stopper, sse
from pp1q.verifier.openai_request import Call, decode_call, fit_open_max
from pp1q.verifier.scheduler import Scheduler
from pp1q.verifier.server import read_body, request_address

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def openai_routes(scheduler: Scheduler, *, model_id: str, tokenizer, decode_kw: dict,
                  check: Callable[[GenerateRequest], GenerateRequest], decoded) -> dict:
    """``decode_kw``: vocab, default_top_k, max_support, text; ``check(req)``: the daemon's
    own refusals and adjustments (speculation mode), returning the request to run;
    ``await decoded(fn, *args, **kw)`` runs the body's decoding (off the event loop where
    it tokenizes)."""
    text = tokenizer if tokenizer is not None else IdText()
    created = int(time.time())

    def handler(chat: bool):
        async def handle(request: web.Request):
            try:
                return await answer(request)
            except (HttpError, ServiceError) as e:
                raise as_openai(e, chat) from None

        async def answer(request: web.Request):
            raw = await read_body(request)
            call = await decoded(decode_call, raw, chat=chat, tokenizer=tokenizer,
                                 model_id=model_id, **decode_kw)
            fit_open_max(call, scheduler.max_positions)
            call.req = check(call.req)
            shape, stopper = Shape(chat, model_id), Stopper(call, text)
            if not call.body.stream:
                answer = await scheduler.generate(call.req, stopper.feed,
                                                  request_address(request))
                return 200, shape.answer(call, stopper, answer)
            return await _stream(request, scheduler, call, shape, stopper)
        return handle

    model = {"id": model_id, "object": "model", "created": created, "owned_by": "pp1q"}

    async def models(request: web.Request):
        return 200, {"object": "list", "data": [model]}

    async def one_model(request: web.Request):  # the client's models.retrieve
        name = request.match_info["model"]
        if name != model_id:
            raise HttpError(404, "model_not_found", f"model {name!r}: this server serves "
                            f"{model_id!r}", param="model")
        return 200, model

    return {("POST", "/v1/completions"): handler(False),
            ("POST", "/v1/chat/completions"): handler(True),
            ("GET", "/v1/models"): models,
            ("GET", "/v1/models/{model:.+}"): one_model}  # a model id may hold "/"


async def _stream(request: web.Request, scheduler: Scheduler, call: Call, shape: Shape,
                  stopper: Stopper) -> web.StreamResponse:
    wake: asyncio.Queue[None] = asyncio.Queue()  # one item per round, max_tokens at most

    def on_tokens(new: list[int]) -> bool:
        wake.put_nowait(None)
        return stopper.feed(new)

    task = asyncio.ensure_future(scheduler.generate(call.req, on_tokens,
                                                    request_address(request)))
    task.add_done_callback(lambda _: wake.put_nowait(None))
    resp: web.StreamResponse | None = None
    try:
        while True:
            await wake.get()
            done = task.done()
            if done and task.exception() is not None:
                if resp is None:
                    raise task.exception()  # nothing sent yet: the error's own status
                await resp.write(sse(_error_event(task.exception())))
                return resp  # no [DONE]: the stream failed
            if resp is None:
                resp = web.StreamResponse(headers=SSE_HEADERS)
                await resp.prepare(request)
            delta = stopper.delta(final=done)  # first: the final one may end the ids
            ids = stopper.take_ids()
            if ids or delta:
                await resp.write(sse(shape.chunk(delta, ids)))
            if done:
                break
        answer = task.result()
        finish = "stop" if stopper.stopped else answer["finish_reason"]
        await resp.write(sse(shape.chunk("", [], finish, answer)))
        if call.body.stream_options is not None and call.body.stream_options.include_usage:
            await resp.write(sse(shape.usage_chunk(call, len(stopper.ids))))
        await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp
    finally:
        if not task.done():
            task.cancel()  # the client left: release the slot, RESET the worker


def _cause(code: str, chat: bool) -> str | None:
    """The OpenAI field that caused one of the daemon's own refusals of a decoded request
    (its ``check``, shared with /v1/generate, whose error objects keep param null), as
    OpenAI names it: the prompt past the context (a chat's: its messages), a sampled
    temperature on a greedy (v1) verifier, and the one processor a vocabulary-sharded
    group bounds (pp1q.verifier.daemon.unsupported_processors: the target top_k)."""
    return {"context_length_exceeded": "messages" if chat else "prompt",
            "sampled_on_v1": "temperature", "unsupported_processors": "top_k"}.get(code)


def as_openai(e: HttpError | ServiceError, chat: bool) -> HttpError:
    """The refusal as the OpenAI routes answer it: a field refused is OpenAI's (and vLLM's)
    400, where ``/v1/generate`` answers 422; the official client raises BadRequestError
    for it (for a 422 it raised UnprocessableEntityError, which clients written against
    OpenAI do not catch). Code and message are kept; param too, or where none was named,
    the field that caused it (``_cause``)."""
    h = as_http(e) if isinstance(e, ServiceError) else e
    if h.status != 422:
        return h
    param = h.param if h.param is not None else _cause(h.code, chat)
    return HttpError(400, h.code, h.message, h.headers, param=param)


def _error_event(e: BaseException) -> dict:
    if isinstance(e, HttpError):
        return error_body(e)
    if isinstance(e, ServiceError):
        return error_body(as_http(e))
    return error_body(INTERNAL)
