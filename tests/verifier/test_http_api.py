"""The verifier's HTTP layer (pp1q.verifier.server on aiohttp) and request schema, probed
with raw bytes from outside: framing attacks, slow clients, many clients, aborted uploads."""

import asyncio
import contextlib
import ctypes
import gc
import gzip
import json
import logging

import pytest

from pp1q.core.errors import Reason, ServiceError
from pp1q.verifier.api import MAX_NEW_TOKENS, MIN_TEMPERATURE, decode_generate
from pp1q.verifier.http import HttpError
from pp1q.verifier.server import MAX_BODY_BYTES, HttpServer, Limits, read_body

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

READ_TIMEOUT_S = 10.0  # one answer from an in-process server; far above what it takes


def _decode(obj, **kw):
    body = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
    args = dict(vocab=100, default_top_k=32, max_support=64) | kw
    return decode_generate(body, **args)


def test_generate_body_defaults_and_overrides():
    r = _decode({"prompt_token_ids": [1, 2], "max_tokens": 3, "seed": 7})
    assert (r.prompt, r.max_tokens, r.seed, r.speculative, r.greedy, r.top_k) == (
        [1, 2], 3, 7, True, False, 32)
    r = _decode({"prompt_token_ids": [1], "max_tokens": 1, "top_k": None, "temperature": 0,
                 "speculative": False})
    assert r.top_k is None and r.greedy and not r.speculative
    assert _decode({"prompt_token_ids": [1], "max_tokens": 1, "top_k": 100}).top_k is None
    assert 0 <= r.seed < 1 << 64  # drawn by the server when absent
    r = _decode({"prompt_token_ids": [1], "max_tokens": 1, "temperature": MIN_TEMPERATURE,
                 "draft_temperature": MIN_TEMPERATURE})  # the least of each is taken
    assert r.processors.temperature == r.draft_temperature == MIN_TEMPERATURE


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "bad_json"),
    ({"prompt_token_ids": [], "max_tokens": 1}, 422, "invalid_field"),
    ({"prompt_token_ids": [1], "max_tokens": 0}, 422, "invalid_field"),
    ({"prompt_token_ids": [1], "max_tokens": MAX_NEW_TOKENS + 1}, 422, "invalid_field"),
    ({"prompt_token_ids": [1], "max_tokens": 1, "seed": -1}, 422, "invalid_field"),
    ({"prompt_token_ids": [1], "max_tokens": 1, "bogus": 1}, 422, "invalid_field"),
    ({"prompt_token_ids": ["a"], "max_tokens": 1}, 422, "invalid_field"),
    ({"prompt_token_ids": [100], "max_tokens": 1}, 422, "token_out_of_vocab"),
    ({"prompt_token_ids": [1], "max_tokens": 1, "temperature": -0.5}, 422, "invalid_field"),
    ({"prompt_token_ids": [1], "max_tokens": 1, "top_p": 0}, 422, "invalid_field"),
    ({"prompt_token_ids": [1], "max_tokens": 1, "stop_token_ids": [100]}, 422,
     "token_out_of_vocab"),
    ({"prompt": "hi", "max_tokens": 1}, 422, "no_tokenizer"),
    ({"prompt": "hi", "prompt_token_ids": [1], "max_tokens": 1}, 422, "invalid_field"),
    ({"max_tokens": 1}, 422, "invalid_field"),
    ({"prompt_token_ids": [1], "max_tokens": 1, "top_k": 65}, 422, "top_k_too_large"),
    ({"prompt_token_ids": [1], "max_tokens": 1, "draft_temperature": 0}, 422, "invalid_field"),
    # subnormal temperatures overflow logits / T: refused, not a 500 (or a refused draft)
    # every round
    ({"prompt_token_ids": [1], "max_tokens": 1, "temperature": 1e-320}, 422, "invalid_field"),
    ({"prompt_token_ids": [1], "max_tokens": 1, "temperature": MIN_TEMPERATURE / 2}, 422,
     "invalid_field"),
    ({"prompt_token_ids": [1], "max_tokens": 1, "draft_temperature": 1e-320}, 422,
     "invalid_field"),
])
def test_bad_bodies_are_refused_with_a_code(body, status, code):
    with pytest.raises(HttpError) as e:
        _decode(body)
    assert (e.value.status, e.value.code) == (status, code)


@pytest.mark.parametrize("body, param", [
    ({"prompt_token_ids": [100], "max_tokens": 1}, "prompt_token_ids"),
    ({"prompt_token_ids": [1], "max_tokens": 1, "stop_token_ids": [100]}, "stop_token_ids"),
    ({"prompt_token_ids": [1], "max_tokens": 1, "top_k": 65}, "top_k"),
])
def test_a_refusal_past_the_schema_names_its_field(body, param):
    """OpenAI's error object's ``param``: the field refused, for the checks msgspec's
    schema does not make too (it was null for these)."""
    with pytest.raises(HttpError) as e:
        _decode(body)
    assert e.value.param == param, e.value.message


# -- the server, from outside ---------------------------------------------------------------


class _Served:
    """An HttpServer on 127.0.0.1 with an echo route (reads the body) and a slow one."""

    def __init__(self, limits: Limits) -> None:
        self.cancelled = 0
        self.refused: list[Reason] = []  # what the server counted as refused connections

        async def echo(request):
            return 200, {"n": len(await read_body(request))}

        async def refuse(request):
            raise ServiceError(Reason.RANK_DISAGREEMENT, "rank 1 refused round")

        async def hang(request):
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise

        self.server = HttpServer({("POST", "/echo"): echo, ("GET", "/healthz"): echo,
                                  ("GET", "/x"): refuse, ("GET", "/hang"): hang}, limits,
                                 on_refused=self.refused.append)

    async def __aenter__(self):
        self.port = await self.server.start("127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc):
        await self.server.close()


async def _raw(port: int, data: bytes) -> bytes:
    """Everything the server sends back until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    out = b""
    try:
        for _ in range(1000):  # bounded: a few reads per answer
            chunk = await asyncio.wait_for(reader.read(1 << 16), READ_TIMEOUT_S)
            if not chunk:
                break
            out += chunk
    except ConnectionResetError:
        pass
    writer.close()
    return out


def _responses(raw: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each HTTP/1.x answer in ``raw`` (Content-Length framed)."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        n = next(int(line.split(b":")[1]) for line in lines
                 if line.lower().startswith(b"content-length"))
        out.append((int(lines[0].split(b" ")[1]), rest[:n]))
        raw = rest[n:]
    return out


def _error(body: bytes) -> str:
    return json.loads(body)["error"]["code"]


FAST = Limits(head_timeout_s=1.0)  # the idle connection of each probe closes soon


async def test_routes_errors_and_keep_alive():
    async with _Served(FAST) as s:
        got = _responses(await _raw(s.port, b"POST /echo HTTP/1.1\r\nHost: a\r\n"
                                            b"Content-Length: 3\r\n\r\nabc"))
        assert got == [(200, b'{"n":3}\n')]
        raw = await _raw(s.port, b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n")
        assert b"Allow: POST" in raw and _responses(raw)[0][0] == 405
        (status, body), = _responses(await _raw(s.port, b"GET /nope HTTP/1.1\r\nHost: a\r\n\r\n"))
        assert (status, _error(body)) == (404, "not_found")
        (status, body), = _responses(await _raw(s.port, b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"))
        assert (status, json.loads(body)) == (500, {"error": {
            "message": "rank 1 refused round", "type": "server_error", "param": None,
            "code": "rank_disagreement"}})
        # two pipelined requests on one connection: two answers, in order
        got = _responses(await _raw(s.port, b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n" * 2))
        assert [g[0] for g in got] == [200, 200]
        # HEAD of a GET route (load balancers' health checks): its headers, no body
        raw = await _raw(s.port, b"HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and body == b""
        raw = await _raw(s.port, b"HEAD /echo HTTP/1.1\r\nHost: a\r\n\r\n")
        assert raw.startswith(b"HTTP/1.1 405")  # a POST route has none


async def test_size_limits():
    async with _Served(FAST) as s:
        huge_head = b"GET /healthz HTTP/1.1\r\nHost: a\r\nX: " + b"a" * 20000 + b"\r\n\r\n"
        assert _responses(await _raw(s.port, huge_head))[0][0] in (400, 431)
        many = b"".join(b"X%d: 1\r\n" % i for i in range(200))
        raw = await _raw(s.port, b"GET /healthz HTTP/1.1\r\nHost: a\r\n" + many + b"\r\n")
        assert _responses(raw)[0][0] in (400, 431)
        declared = b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 2147483648\r\n\r\n"
        (status, body), = _responses(await _raw(s.port, declared))
        assert (status, _error(body)) == (413, "body_too_large")
        chunked = (b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                   + b"100000\r\n" + b"x" * (1 << 20) + b"\r\n" + b"10\r\n" + b"x" * 16
                   + b"\r\n0\r\n\r\n")
        status, body = _responses(await _raw(s.port, chunked))[0]
        assert (status, _error(body)) == (413, "body_too_large")
        # a gzip bomb: ~8 KiB on the wire, 8 MiB inflated; refused at 1 MiB inflated
        bomb = gzip.compress(b"[" + b"0," * (4 << 20) + b"0]")
        (status, body), = _responses(await _raw(
            s.port, b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Encoding: gzip\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(bomb) + bomb))
        assert (status, _error(body)) == (413, "body_too_large")


@pytest.mark.parametrize("body", [
    b"abc",  # not gzip at all
    gzip.compress(b'{"a": 1}', mtime=0) + b"trailing",  # gzip, then bytes after its end
], ids=["not_gzip", "trailing_bytes"])
async def test_a_body_that_does_not_inflate_is_a_400_not_a_500(body, caplog):
    # aiohttp fails the body's read (RequestPayloadError): a client's fault, answered
    # 400 bad_body; it was a 500 internal and a traceback in the log per request
    async with _Served(FAST) as s:
        with caplog.at_level(logging.ERROR, logger="pp1q.http"):
            (status, answer), = _responses(await _raw(
                s.port, b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Encoding: gzip\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body))
        assert (status, _error(answer)) == (400, "bad_body")
        assert not caplog.records


async def test_smuggling_a_request_in_a_refused_body_gets_no_answer():
    async with _Served(FAST) as s:
        for length in (b"abc", b"\xb2", b"-1", b"1 2"):
            raw = await _raw(s.port, b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: "
                             + length + b"\r\n\r\nGET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
            assert raw.count(b"HTTP/1.") == 1, (length, raw)  # one answer, then closed
            assert raw.startswith((b"HTTP/1.1 400", b"HTTP/1.0 400")), (length, raw)
        both = b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n"
        raw = await _raw(s.port, b"POST /echo HTTP/1.1\r\nHost: a\r\n" + both +
                         b"\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        assert raw.count(b"HTTP/1.") == 1 and b" 400 " in raw.split(b"\r\n")[0]


async def test_slowloris_head_is_cut_off():
    async with _Served(Limits(head_timeout_s=0.5)) as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        head = b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Slow: " + b"a" * 400
        sent = 0
        closed = False
        for byte in head:  # one byte per 20 ms: the whole head would take 8 s
            try:
                writer.write(bytes([byte]))
                await writer.drain()
            except ConnectionError:
                closed = True
                break
            sent += 1
            try:
                if await asyncio.wait_for(reader.read(1), 0.02) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except ConnectionError:
                closed = True
                break
        writer.close()
        assert closed and sent < len(head)


async def test_slow_body_gets_408():
    async with _Served(Limits(head_timeout_s=5, body_timeout_s=0.3)) as s:
        (status, body), = _responses(await _raw(
            s.port, b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nab"))
        assert (status, _error(body)) == (408, "body_timeout")


async def test_a_chunked_body_broken_after_its_first_chunk_gets_408():
    # aiohttp's C parser drops such a body without failing the handler's read: the body
    # deadline answers it (operations.md says so; a 400 here would mean aiohttp fixed it)
    async with _Served(Limits(head_timeout_s=5, body_timeout_s=0.3)) as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5\r\n{\"pro\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # the handler is reading its body
        writer.write(b"ZZ\r\nxx\r\n")  # not a chunk size
        raw = await asyncio.wait_for(reader.read(1 << 16), READ_TIMEOUT_S)
        writer.close()
        (status, body), = _responses(raw)
        assert (status, _error(body)) == (408, "body_timeout")


async def test_a_disconnected_client_cancels_its_handler():
    async with _Served(FAST) as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        writer.write(b"GET /hang HTTP/1.1\r\nHost: a\r\n\r\n")
        await writer.drain()
        for _ in range(100):  # bounded wait until the handler runs
            if s.server.app is not None and len(s.server._runner.server.connections):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        writer.close()
        for _ in range(500):
            if s.cancelled:
                break
            await asyncio.sleep(0.01)
        assert s.cancelled == 1


async def test_connection_cap_answers_503():
    async with _Served(Limits(max_connections=3, head_timeout_s=5)) as s:
        held = [await asyncio.open_connection("127.0.0.1", s.port) for _ in range(3)]
        for _ in range(100):
            if len(s.server._runner.server.connections) == 3:
                break
            await asyncio.sleep(0.01)
        raw = await _raw(s.port, b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        (status, body), = _responses(raw)
        assert (status, _error(body)) == (503, "busy")
        assert s.refused == [Reason.TOO_MANY_CONNECTIONS]  # counted (requests_refused_total)
        for _, w in held:
            w.close()


def _rss_kib() -> int:
    """Resident memory after a collection, with freed heap handed back to the OS where
    glibc can (malloc_trim): what is left is memory still held, not the allocator's
    high-water mark, which the machine's load moves by tens of MiB."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


async def _aborted_upload(port: int, payload: bytes) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n"
                 % (len(payload) + 1))
    writer.write(payload)  # one byte short of the declared body, then gone
    await writer.drain()
    writer.close()


async def test_memory_flat_after_1000_aborted_uploads():
    """The old server grew by 1.1 GB over 1200 such uploads and never gave it back."""
    from aiohttp.web_protocol import RequestHandler

    payload = b"x" * (MAX_BODY_BYTES - 1)
    async with _Served(FAST) as s:
        async def rounds(n: int) -> None:
            for _ in range(n // 50):  # 50 at a time: the peak is 50 bodies in flight
                await asyncio.gather(*(_aborted_upload(s.port, payload) for _ in range(50)))
                for _ in range(500):  # bounded: the server notices every close
                    if not s.server._runner.server.connections:
                        break
                    await asyncio.sleep(0.01)

        await rounds(200)  # warm-up: the allocator's high-water mark at 50 in flight
        gc.collect()
        rss0 = _rss_kib()
        await rounds(1000)
        gc.collect()
        grown_mib = (_rss_kib() - rss0) / 1024
        # type(), not isinstance(): a lazy module among the objects warns on __class__
        handlers = sum(type(o) is RequestHandler for o in gc.get_objects())
        assert not s.server._runner.server.connections
        assert handlers <= 2, handlers  # every connection's handler was freed
        # generous: 1000 uploads of 1 MiB each would be ~1000 MiB if any were retained
        assert grown_mib < 64, grown_mib


def test_target_processors_and_stop_ids_are_decoded():
    r = _decode({"prompt_token_ids": [1], "max_tokens": 1, "temperature": 0.7, "top_p": 0.9,
                 "target_top_k": 5, "stop_token_ids": [4, 9]})
    assert (r.processors.temperature, r.processors.top_k, r.processors.top_p) == (0.7, 5, 0.9)
    assert r.processors.context_version not in (0, None) and r.stop_ids == {4, 9}
    # no-op settings are the default set: same context version as no processors at all
    r = _decode({"prompt_token_ids": [1], "max_tokens": 1, "target_top_k": 100, "top_p": 1})
    assert r.processors.is_default and r.processors.context_version == 0
    assert _decode({"prompt_token_ids": [1], "max_tokens": 1, "temperature": 0.7,
                    "top_p": 0.8}).processors.context_version != _decode(
        {"prompt_token_ids": [1], "max_tokens": 1, "temperature": 0.7,
         "top_p": 0.9}).processors.context_version


def test_finish_cuts_at_the_first_stop_id_or_the_length():
    from pp1q.verifier.api import finish

    assert finish([5, 6, 2, 7, 2], 10, frozenset({2})) == ([5, 6, 2], "stop")
    assert finish([5, 6, 7], 2, frozenset({7})) == ([5, 6], "length")  # beyond max_tokens
    assert finish([5, 6, 7], 3, frozenset()) == ([5, 6, 7], "length")
