"""The figures the docs quote for named limits are the constants' values: each phrase
below is written from the constant, so a limit changed in the code, or a figure changed
in a doc, fails here until both agree. (The settings' defaults and ranges are checked
by tests/runtime/test_settings.py, the metrics by tests/runtime/test_metrics_documented.py.)"""

from __future__ import annotations

import re
from pathlib import Path

from pp1q.models.engine import PREFILL_CHUNK
from pp1q.runtime import malloc, metrics_http
from pp1q.runtime.capture.format import MAX_META_BYTES, MAX_META_DEPTH, MAX_OPEN_CONNECTIONS
from pp1q.runtime.config import MAX_CONFIG_BYTES
from pp1q.runtime.settings import (
    DEFAULT_HTTP_CONNECTIONS_PER_ADDRESS,
    DEFAULT_QUEUED_PER_ADDRESS,
    MAX_HTTP_CONNECTIONS,
    MAX_QUEUED_REQUESTS,
    REAL_MODEL_WATCHDOG_MS,
    TOY_WATCHDOG_MS,
)
from pp1q.verifier import api, http_gate, link, link_health, openai_request, server
from pp1q.worker import drafting
from pp1q.worker.connection import WRITE_HIGH_WATER_CAP
from pp1q.worker.engine_proposer import MAX_OPEN_REQUESTS
from pp1q_kernels.shard_processors import MAX_SHARD_TOP_K

ROOT = Path(__file__).resolve().parents[2]
KiB, MiB = 1 << 10, 1 << 20


def _n(x: float) -> str:
    return f"{x:g}".replace("e-0", "e-")  # 1e-6, as the docs write it


OPS = "docs/operations.md"
# (doc, the phrase as the doc writes it, made from the constants)
QUOTED = [
    (OPS, f"at most {MAX_CONFIG_BYTES // MiB} MiB (`pp1q/runtime/config.py:MAX_CONFIG_BYTES`)"),
    (OPS, f"queue ({MAX_QUEUED_REQUESTS} at most, `requests_queued_per_address`"),
    (OPS, f"unset: {TOY_WATCHDOG_MS} for the toy, {REAL_MODEL_WATCHDOG_MS} for a real model"),
    (OPS, f"body {server.MAX_BODY_BYTES // MiB} MiB"),
    (OPS, f"request line and each header line {server.MAX_LINE_BYTES // KiB} KiB; "
          f"{server.MAX_HEADERS} header lines"),
    (OPS, f"a whole request head within {_n(server.HEAD_TIMEOUT_S)} s of the connection"),
    (OPS, f"a declared body within {_n(server.BODY_TIMEOUT_S)} s (408)"),
    (OPS, f"{MAX_HTTP_CONNECTIONS} open connections, {DEFAULT_HTTP_CONNECTIONS_PER_ADDRESS} "
          "of them from one client address"),
    (OPS, f"takes none of its answer for {_n(http_gate.WRITE_STALL_S)} s"),
    (OPS, f"slower than {http_gate.RECLAIM_MIN_BPS // KiB} KiB/s (`RECLAIM_MIN_BPS`)"),
    (OPS, f"the scheduler's queue holds {MAX_QUEUED_REQUESTS} requests"),
    (OPS, f"{DEFAULT_QUEUED_PER_ADDRESS} of them from one client address "
          "(`requests_queued_per_address`"),
    (OPS, f"1..{api.MAX_PROMPT_TOKENS} ids"),
    (OPS, f"1..{api.MAX_NEW_TOKENS} new tokens"),
    (OPS, f"list of up to {openai_request.MAX_STOP} strings"),
    (OPS, f"list of up to {openai_request.MAX_STOP_TOKEN_IDS} ids < vocab"),
    (OPS, f"up to {api.MAX_STOP_IDS} ids"),
    (OPS, f"1..{openai_request.MAX_MESSAGES} messages"),
    (OPS, f"{openai_request.MAX_METADATA_PAIRS} pairs, keys of "
          f"{openai_request.MAX_METADATA_KEY} characters, values of "
          f"{openai_request.MAX_METADATA_VALUE}"),
    (OPS, f"[{_n(api.MIN_TEMPERATURE)}, {_n(api.MAX_TEMPERATURE)}]"),
    (OPS, f"prefilled in chunks of {PREFILL_CHUNK} ids (`pp1q.models.engine.PREFILL_CHUNK`)"),
    (OPS, f"{link_health.DEGRADED_AFTER_FAILURES} or more STEPs in a row gave no proposal"),
    (OPS, f"backoff from {_n(link.FIRST_BACKOFF_S * 1000)} ms"),
    (OPS, f"mmap above {malloc.MMAP_THRESHOLD_BYTES // MiB} MiB, "
          f"trim above {malloc.TRIM_THRESHOLD_BYTES // MiB} MiB"),
    (OPS, f"{metrics_http.MAX_SCRAPE_CONNECTIONS} connections served at once, "
          f"{metrics_http.MAX_SCRAPE_CONNECTIONS_PER_ADDRESS} of them from one client address"),
    (OPS, f"Each connection has {_n(metrics_http.SCRAPE_DEADLINE_S)} s from its accept"),
    (OPS, f"never holds more than {WRITE_HIGH_WATER_CAP // MiB} MiB "
          "(`pp1q/worker/connection.py:WRITE_HIGH_WATER_CAP`)"),
    (OPS, f"`YIELD_AT_BYTES` ({drafting.YIELD_AT_BYTES // KiB} KiB)"),
    (OPS, f"`YIELD_AFTER_S` ({_n(drafting.YIELD_AFTER_S * 1000)} ms)"),
    (OPS, f"at most {MAX_OPEN_REQUESTS} requests and `draft_kv_budget_bytes`"),
    (OPS, f"A `target_top_k` above {MAX_SHARD_TOP_K} (`MAX_SHARD_TOP_K`"),
    ("README.md", f"top-k (up to {MAX_SHARD_TOP_K}; above it 422"),
    ("docs/capture.md", f"an OPEN/CLOSE/INFO body at most {MAX_META_BYTES} bytes; at most "
                        f"{MAX_OPEN_CONNECTIONS} connections open at once "
                        "(`MAX_OPEN_CONNECTIONS`"),
    ("docs/capture.md", f"nested deeper than {MAX_META_DEPTH} `[`/`{{` outside strings, "
                        "`MAX_META_DEPTH`"),
]


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)  # a phrase may be wrapped over lines


def misquoted(quoted: list[tuple[str, str]]) -> list[str]:
    texts = {doc: _flat((ROOT / doc).read_text()) for doc, _ in quoted}
    return [f"{doc}: {phrase!r}" for doc, phrase in quoted if phrase not in texts[doc]]


def test_every_quoted_limit_is_the_constant():
    assert misquoted(QUOTED) == []


def test_a_limit_quoted_otherwise_is_caught():
    # the slots row gave the per-address default (256) as the whole queue's bound (512)
    planted = [(OPS, f"queue ({DEFAULT_QUEUED_PER_ADDRESS} at most, "
                     "`requests_queued_per_address`"),
               (OPS, f"body {2 * server.MAX_BODY_BYTES // MiB} MiB")]
    assert misquoted(planted) == [f"{OPS}: {p!r}" for _, p in planted]
