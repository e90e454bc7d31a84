"""The verifier's HTTP layer and request schema, without daemons."""

import asyncio
import json

import pytest

from pp1q.core.errors import Reason, ServiceError
from pp1q.verifier.api import MAX_NEW_TOKENS, decode_generate
from pp1q.verifier.http import (
    MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
    HttpError,
    HttpServer,
    encode_response,
    parse_head,
)

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers


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
])
def test_bad_bodies_are_refused_with_a_code(body, status, code):
    with pytest.raises(HttpError) as e:
        _decode(body)
    assert (e.value.status, e.value.code) == (status, code)


def test_parse_head_and_limits():
    h = parse_head(b"POST /v1/generate?x=1 HTTP/1.1\r\nContent-Length: 5\r\nHost: a\r\n\r\n")
    assert (h.method, h.path, h.content_length(), h.keep_alive) == ("POST", "/v1/generate", 5,
                                                                    True)
    assert not parse_head(b"GET / HTTP/1.0\r\n\r\n").keep_alive
    for raw, status in [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\nbad header\r\n\r\n", 400),
    ]:
        with pytest.raises(HttpError) as e:
            parse_head(raw)
        assert e.value.status == status
    too_big = parse_head(f"POST / HTTP/1.1\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n"
                         .encode())
    with pytest.raises(HttpError) as e:
        too_big.content_length()
    assert e.value.status == 413
    chunked = parse_head(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    with pytest.raises(HttpError) as e:
        chunked.content_length()
    assert e.value.status == 411


async def _exchange(port: int, raw: bytes) -> tuple[int, dict, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    body = await asyncio.wait_for(reader.readexactly(length), 5)
    writer.close()
    return int(head.split(b" ")[1]), json.loads(body), head


async def test_server_routes_errors_and_keep_alive():
    async def echo(head, body):
        return 200, {"n": len(body)}

    server = HttpServer({("POST", "/echo"): echo, ("GET", "/healthz"): echo})
    port = await server.start("127.0.0.1", 0)
    try:
        status, body, _ = await _exchange(
            port, b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
        assert (status, body) == (200, {"n": 3})
        status, body, head = await _exchange(port, b"GET /echo HTTP/1.1\r\n\r\n")
        assert status == 405 and b"Allow: POST" in head
        status, body, _ = await _exchange(port, b"GET /nope HTTP/1.1\r\n\r\n")
        assert (status, body["error"]["code"]) == (404, "not_found")
        status, body, _ = await _exchange(
            port, b"GET /healthz HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n")
        assert status == 431
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(
            b"HTTP/1.1 100 Continue")
        writer.write(b"ab")
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(
            b"HTTP/1.1 200")
        writer.close()
        # two requests on one connection
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):
            writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200") and b"keep-alive" in head
            await reader.readexactly(len(b'{"n":0}\n'))
        writer.close()
    finally:
        await server.close()


async def test_http_layer_answers_a_service_error_with_its_status():
    async def handler(head, body):
        raise ServiceError(Reason.RANK_DISAGREEMENT, "rank 1 refused round")

    server = HttpServer({("GET", "/x"): handler})
    port = await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = await reader.read()
        writer.close()
    finally:
        await server.close()
    want = encode_response(500, {"error": {"code": "rank_disagreement",
                                           "message": "rank 1 refused round"}}, False)
    assert raw == want


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
