"""Mutual TLS between worker and verifier, and refused peers counted by reason.

The daemons run in-process on 127.0.0.1 (worker: ``serve``; verifier: its ``WorkerLink``
from ``build``) with certificates generated here (tests/support/tls_certs.py). A peer without a
valid certificate is refused and counted as ``peers_refused{reason="tls_handshake"}``; a
HELLO whose identity does not match is refused and counted as ``identity_mismatch``.
The end-to-end request through the HTTP API with real processes is in test_tls_daemons.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl

import pytest
from daemon_harness import scrape, value
from tls_certs import Ca

from pp1q.cli import verifier as verifier_cmd
from pp1q.cli import worker as worker_cmd
from pp1q.core.errors import ConfigError
from pp1q.core.outcomes import PeerRefusal
from pp1q.models.toy import ToySpec
from pp1q.runtime import tls
from pp1q.runtime.config import resolve
from pp1q.runtime.settings import VerifierSettings, WorkerSettings
from pp1q.verifier.daemon import build as build_verifier
from pp1q.wire import WIRE_REVISION, FrameDecoder, HelloAnswer, Refusal, VerifierEndpoint, encode
from pp1q.wire.session_config import identity, verifier_config
from pp1q.worker.daemon import serve

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

VOCAB = 16
TIMEOUT_S = 10.0  # every exchange below takes milliseconds on loopback
REFUSED = "pp1q_peers_refused_total"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Our CA with a worker, a verifier and an expired certificate; a foreign CA."""
    d = tmp_path_factory.mktemp("pki")
    ca, foreign = Ca(d / "ours"), Ca(d / "foreign", "foreign-ca")
    return {"ca": ca, "foreign": foreign,
            "worker": ca.issue("worker", server=True),
            "verifier": ca.issue("verifier", server=False),
            "expired": ca.issue("expired", server=False, expired=True),
            "intruder": foreign.issue("intruder", server=False),
            "impostor": foreign.issue("impostor", server=True)}


def _settings(cls, **over):
    return cls(**{"vocab": VOCAB, "metrics_port": 0, "speculation": "sampled", **over})


@contextlib.asynccontextmanager
async def worker(**over):
    """An in-process worker on 127.0.0.1; yields (port, metrics scraper)."""
    stop, ports = asyncio.Event(), []
    settings = _settings(WorkerSettings, listen="127.0.0.1:0", draft_preset="far", **over)
    task = asyncio.create_task(serve(settings, stop, ready=lambda p, m: ports.append((p, m))))
    while not ports and not task.done():
        await asyncio.sleep(0.01)
    port, mport = ports[0]
    try:
        yield port, lambda: scrape(mport)
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT_S)


async def _hello(port: int, model_seed: int = 0, **tls_kwargs):
    """One HELLO over a fresh connection; the decoded answer (HelloAnswer or Refusal), or
    the exception the connection ended with."""
    config = verifier_config(ToySpec(vocab=VOCAB, seed=model_seed), (2, 1), 4, 5, 8)
    ep = VerifierEndpoint(config, session=7)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, **tls_kwargs)
        writer.write(ep.hello())
        data = await asyncio.wait_for(reader.read(65536), TIMEOUT_S)
        writer.close()
    except (OSError, ssl.SSLError) as e:  # the worker closing on us during or after TLS
        return e
    return FrameDecoder(config.limits).feed(data)[0] if data else ConnectionResetError()


def _client(leaf, ca=None, name="127.0.0.1") -> dict:
    return tls.client_tls(VerifierSettings(**leaf.settings(ca)), name).kwargs()


def _refused(samples, reason: PeerRefusal) -> float:
    return value(samples, REFUSED, reason=reason.value)


# -- settings -------------------------------------------------------------------------


def test_tls_needs_all_three_files_and_says_which_is_wrong(pki, tmp_path):
    leaf = pki["worker"]
    assert tls.server_context(WorkerSettings()) is None  # off by default
    assert tls.client_tls(VerifierSettings(), "h") is None
    with pytest.raises(ConfigError, match="missing tls_ca"):  # refused as the settings are made
        WorkerSettings(tls_cert=str(leaf.cert), tls_key=str(leaf.key))
    with pytest.raises(ConfigError, match="tls_ca = .*nope.pem"):
        tls.server_context(WorkerSettings(**leaf.settings(tmp_path / "nope.pem")))
    with pytest.raises(ConfigError, match="tls_cert"):  # the key of another certificate
        tls.server_context(WorkerSettings(**{**leaf.settings(),
                                             "tls_key": str(pki["verifier"].key)}))


def test_a_key_every_user_can_read_is_refused_a_group_may_read_it(pki, tmp_path):
    leaf = pki["worker"]
    key = tmp_path / "worker.key"
    key.write_bytes(leaf.key.read_bytes())
    settings = WorkerSettings(**{**leaf.settings(), "tls_key": str(key)})
    for mode in (0o644, 0o604):
        key.chmod(mode)
        with pytest.raises(ConfigError, match=f"tls_key = .*mode {mode:o}.*chmod 600"):
            tls.server_context(settings)
    key.chmod(0o640)
    assert tls.server_context(settings) is not None


@pytest.mark.parametrize("which", ["tls_cert", "tls_key", "tls_ca"])
def test_a_tls_file_that_is_a_fifo_is_refused_at_once(pki, tmp_path, which):
    """OpenSSL opens the files by name: a FIFO with no writer blocked it for ever."""
    import os
    import threading

    fifo = tmp_path / "fifo.pem"
    os.mkfifo(fifo)
    settings = WorkerSettings(**{**pki["worker"].settings(), which: str(fifo)})
    out: list = []

    def run():
        try:
            tls.server_context(settings)
        except ConfigError as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(TIMEOUT_S)
    assert not t.is_alive(), f"{which} as a FIFO hung"
    assert out and "is a FIFO, not a regular file" in str(out[0]), out


def test_options_and_toml_keys_reach_the_settings(pki, tmp_path):
    v = pki["verifier"]
    cfg = tmp_path / "pp1q.toml"
    cfg.write_text(f'tls_ca = "{v.ca}"\n[verifier]\ntls_cert = "{v.cert}"\n'
                   f'tls_key = "{v.key}"\ntls_server_name = "worker.internal"\n')
    p = argparse.ArgumentParser()
    verifier_cmd.add_arguments(p)
    s = resolve(p.parse_args(["--config", str(cfg), "--tls-server-name", "w2"]), "verifier")
    assert (s.tls_cert, s.tls_ca, s.tls_server_name) == (str(v.cert), str(v.ca), "w2")
    p = argparse.ArgumentParser()
    worker_cmd.add_arguments(p)
    w = resolve(p.parse_args(pki["worker"].args()), "worker")
    assert w.tls_key == str(pki["worker"].key)


def test_contexts_are_tls13_both_ways_required_and_trust_only_the_ca(pki):
    server = tls.server_context(WorkerSettings(**pki["worker"].settings()))
    client = tls.client_tls(VerifierSettings(**pki["verifier"].settings()), "10.0.0.2")
    for ctx in (server, client.context):
        assert ctx.minimum_version is ssl.TLSVersion.TLSv1_3
        assert ctx.verify_mode is ssl.CERT_REQUIRED
        assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName",
                                                                  "pp1q-test-ca"),),)]
    assert client.context.check_hostname and client.server_name == "10.0.0.2"
    renamed = tls.client_tls(VerifierSettings(**pki["verifier"].settings(), tls_server_name="w"),
                             "10.0.0.2")
    assert renamed.server_name == "w"


# -- the worker refuses and counts ----------------------------------------------------


async def test_worker_serves_a_verifier_with_a_valid_certificate(pki):
    async with worker(**pki["worker"].settings()) as (port, metrics):
        answer = await _hello(port, **_client(pki["verifier"]))
        assert isinstance(answer, HelloAnswer)
        assert all(_refused(metrics(), r) == 0 for r in PeerRefusal)


@pytest.mark.parametrize("peer", ["no certificate", "foreign CA", "expired", "plain TCP"])
async def test_worker_refuses_and_counts_a_peer_without_a_valid_certificate(pki, peer):
    ca = pki["ca"].path
    if peer == "no certificate":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cafile=ca)
        kwargs = {"ssl": ctx, "server_hostname": "127.0.0.1"}
    elif peer == "plain TCP":
        kwargs = {}
    else:  # trusts the worker, but presents a certificate the worker must not accept
        kwargs = _client(pki["intruder" if peer == "foreign CA" else "expired"], ca=ca)
    async with worker(**pki["worker"].settings()) as (port, metrics):
        answer = await _hello(port, **kwargs)
        assert not isinstance(answer, HelloAnswer | Refusal), answer  # no wire byte back
        m = metrics()
        assert _refused(m, PeerRefusal.TLS_HANDSHAKE) == 1
        assert value(m, "pp1q_steps_total") == 0
        # the worker still serves a peer with a valid certificate
        assert isinstance(await _hello(port, **_client(pki["verifier"])), HelloAnswer)


async def test_worker_counts_a_hello_identity_that_does_not_match(pki):
    async with worker(**pki["worker"].settings()) as (port, metrics):
        answer = await _hello(port, model_seed=1, **_client(pki["verifier"]))
        assert isinstance(answer, Refusal) and answer.reason == "wrong_identity"
        m = metrics()
        assert _refused(m, PeerRefusal.IDENTITY_MISMATCH) == 1
        assert _refused(m, PeerRefusal.TLS_HANDSHAKE) == 0
        assert value(m, "pp1q_validation_failures_total", reason="wrong_identity") == 1


# -- the verifier refuses and counts --------------------------------------------------


async def _run_link(port: int, until, **over):
    """The verifier's link to ``port``, run until ``until(link, metrics)`` or the deadline;
    returns (metrics, whether a session ever came up)."""
    settings = _settings(VerifierSettings, worker=f"127.0.0.1:{port}", reconnect_max_s=0.05,
                         top_k=8, **over)
    link, _scheduler, metrics, _config = build_verifier(settings)
    stop, ever_ready = asyncio.Event(), False
    task = asyncio.create_task(link.run(stop))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT_S
    try:
        while not until(link, metrics) and loop.time() < deadline:
            ever_ready |= link.ready
            await asyncio.sleep(0.01)
        ever_ready |= link.ready
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT_S)
    return metrics, ever_ready


def _counted(reason: PeerRefusal):
    return lambda _link, m: m.value(REFUSED, reason=reason.value) >= 1


async def test_verifier_link_comes_up_over_mutual_tls(pki):
    async with worker(**pki["worker"].settings()) as (port, worker_metrics):
        metrics, ready = await _run_link(port, lambda link, _m: link.ready,
                                         **pki["verifier"].settings())
        assert ready  # HELLO answered over TLS (the context travels on the same connection)
        assert all(metrics.value(REFUSED, reason=r.value) == 0 for r in PeerRefusal)
        assert all(_refused(worker_metrics(), r) == 0 for r in PeerRefusal)


@pytest.mark.parametrize("case", ["foreign CA", "wrong name", "plain worker"])
async def test_verifier_refuses_and_counts_a_worker_it_cannot_authenticate(pki, case):
    worker_tls = {"foreign CA": pki["impostor"].settings(pki["ca"].path),
                  "wrong name": pki["worker"].settings(), "plain worker": {}}[case]
    name = {"tls_server_name": "worker.example"} if case == "wrong name" else {}
    async with worker(**worker_tls) as (port, worker_metrics):
        if case == "plain worker":  # no TLS answer at all: the worker counts a bad frame
            until = lambda _l, _m: value(  # noqa: E731
                worker_metrics(), "pp1q_validation_failures_total", reason="bad_magic") >= 1
        else:
            until = _counted(PeerRefusal.TLS_HANDSHAKE)
        metrics, ready = await _run_link(port, until, **pki["verifier"].settings(), **name)
        assert not ready and until(None, metrics)
        assert value(worker_metrics(), "pp1q_steps_total") == 0


async def test_verifier_counts_a_worker_identity_that_does_not_match():
    async def fake_worker(reader, writer):  # answers any HELLO with another model's identity
        try:
            hello = FrameDecoder().feed(await reader.read(65536))[0]
            other = identity(ToySpec(vocab=VOCAB, seed=1))
            writer.write(encode(HelloAnswer(session=hello.session, version=2, identity=other,
                                            revision=WIRE_REVISION, limits=hello.limits)))
            await reader.read(65536)
        finally:  # from Python 3.12, leaving ``async with server`` waits for this close
            writer.close()

    server = await asyncio.start_server(fake_worker, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        metrics, ready = await _run_link(port, _counted(PeerRefusal.IDENTITY_MISMATCH))
    assert not ready and metrics.value(REFUSED, reason="identity_mismatch") >= 1
    assert metrics.value("pp1q_validation_failures_total", reason="wrong_identity") >= 1


async def test_verifier_counts_a_worker_whose_limits_are_too_small():
    async with worker(max_support=4) as (port, _metrics):  # the verifier needs top_k 8
        metrics, ready = await _run_link(port, _counted(PeerRefusal.HELLO_INCOMPATIBLE))
    assert not ready and metrics.value(REFUSED, reason="hello_incompatible") >= 1
