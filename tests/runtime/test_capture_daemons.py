"""Captures of the real daemons' traffic, recorded with ``pp1q.runtime.capture.tap`` around
their own protocol factories (in one process, standard asyncio loop), replay with no
divergence and every round decided again gives the captured commit."""

import argparse
import asyncio

import pytest

from pp1q.cli import verifier as verifier_cmd
from pp1q.cli import worker as worker_cmd
from pp1q.core.drawkey import DRAW_KEY_ID
from pp1q.runtime.capture import CaptureWriter, Role, read_capture, tap
from pp1q.runtime.config import resolve
from pp1q.runtime.draw_secret import write_secret_file
from pp1q.tools.client import Client
from pp1q.tools.replay import decode, replay_verifier, target_from_identity
from pp1q.verifier.daemon import serve as serve_verifier
from pp1q.worker.daemon import serve as serve_worker

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

VOCAB = 64
REQUESTS = [  # (prompt, max_tokens, options): sampled dense and sparse, greedy
    ([1, 2, 3], 12, {"seed": 7}),
    ([4, 5], 10, {"seed": 8, "top_k": None, "draft_temperature": 0.8}),
    ([6, 7, 8], 8, {"seed": 9, "temperature": 0.0}),
]
START_TIMEOUT_S = 30.0  # both daemons start in well under a second here


def _settings(mod, role: str, argv: list[str]):
    p = argparse.ArgumentParser()
    mod.add_arguments(p)
    return resolve(p.parse_args(argv), role)


async def _run_pair(tmp_path, capture_side: str) -> CaptureWriter:
    """Worker and verifier in this loop; the chosen side's connections are tapped."""
    loop = asyncio.get_running_loop()
    secret = tmp_path / "draw.secret"
    keys = write_secret_file(str(secret))
    fingerprint = keys.fingerprint if capture_side == "verifier" else None  # as each daemon
    cap = CaptureWriter(tmp_path / f"{capture_side}.pp1qcap", role=Role[capture_side.upper()],
                        info={"step_timeout_s": 2.0,
                              "draw_key": {"id": DRAW_KEY_ID, "fingerprint": fingerprint}})
    cap.draws = keys
    stop = asyncio.Event()
    worker_ready = loop.create_future()
    verifier_ready = loop.create_future()
    real_server, real_connect = loop.create_server, loop.create_connection

    def tapped_server(factory, *a, **kw):  # only the worker's listener: HTTP stays plain
        return real_server(tap(factory, cap), *a, **kw)

    def tapped_connect(factory, *a, **kw):
        return real_connect(tap(factory, cap), *a, **kw)

    if capture_side == "worker":
        loop.create_server = tapped_server
    w_task = loop.create_task(serve_worker(_settings(worker_cmd, "worker", [
        "--listen", "127.0.0.1:0", "--vocab", str(VOCAB), "--draft-preset", "far",
        "--speculation", "sampled"]),
        stop, lambda port, _m: worker_ready.set_result(port)))
    port = await asyncio.wait_for(worker_ready, START_TIMEOUT_S)
    loop.create_server = real_server
    if capture_side == "verifier":
        loop.create_connection = tapped_connect
    v_task = loop.create_task(serve_verifier(_settings(verifier_cmd, "verifier", [
        "--worker", f"127.0.0.1:{port}", "--http", "127.0.0.1:0", "--vocab", str(VOCAB),
        "--watchdog-ms", "2000", "--speculation", "sampled", "--draw-secret-file", str(secret)]),
        stop, lambda http, _m: verifier_ready.set_result(http)))
    http = await asyncio.wait_for(verifier_ready, START_TIMEOUT_S)
    try:
        client = Client(f"http://127.0.0.1:{http}", timeout=60)
        await asyncio.to_thread(client.wait_connected, START_TIMEOUT_S)
        for prompt, n, options in REQUESTS:
            out = await asyncio.to_thread(client.generate, prompt, n, **options)
            assert len(out["token_ids"]) == n
    finally:
        loop.create_server, loop.create_connection = real_server, real_connect
        stop.set()
        await asyncio.wait_for(asyncio.gather(w_task, v_task), START_TIMEOUT_S)
        cap.close()
    return cap


def _target():
    return target_from_identity(f"toy-target-v1:vocab={VOCAB}:seed=0")


@pytest.mark.parametrize("side", ["worker", "verifier"])
async def test_daemon_capture_replays_and_redecides(tmp_path, side):
    cap = await _run_pair(tmp_path, side)
    header, recs = read_capture(cap.path)
    assert header.role is Role[side.upper()]
    protocols = sorted(r.meta["protocol"] for r in recs if r.kind.name == "OPEN")
    # one wire connection per session: the context travels in its CONTEXT frames
    assert protocols == ["wire"]
    kinds = {type(i.message).__name__ for i in decode(header.role, recs) if i.what == "frame"}
    assert {"Hello", "HelloAnswer", "Context", "Step", "Reply", "Completion", "Commit"} <= kinds
    report = replay_verifier(cap.path, target=_target(), draws=cap.draws)
    assert report.ok, report.divergences
    assert not report.failures and not report.stream_errors
    assert len(report.commits) >= len(REQUESTS) and len(report.ready) == len(report.commits)
    # either side's capture holds every CONTEXT: every round is decided again
    assert report.rechecked == len(report.commits) and report.not_rechecked == 0
