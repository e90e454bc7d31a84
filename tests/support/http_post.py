"""One JSON POST to a test server on 127.0.0.1 over a fresh connection (Connection:
close), read to its end: (status, head, payload), the payload as sent (chunked or not)."""

from __future__ import annotations

import asyncio
import json


async def post_json(port: int, path: str, body: dict, wait_s: float) -> tuple[int, bytes, bytes]:
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    raw = await asyncio.wait_for(reader.read(), wait_s)
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head, payload
