"""``pp1q replay FILE --worker HOST:PORT`` against real worker daemons: a capture of a toy
session replays with every step matched on a worker like the one recorded; a worker
drafting wrong q, another preset, another model, a silent socket, nothing listening and
a capture with a corrupted REPLY are each rejected with their exit status and line.
How a replay ends otherwise, through the adapter (the sans-IO core's cases are
test_replay_live_paths.py): the worker's connection reset mid-answer and its bytes
corrupted on the way (pp1q.tools.chaos's proxy in front of it), a port that is not a
worker's, a capture that breaks part-way, a worker with other limits, a chaos session's
network copies."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading

import pytest
from daemon_harness import Pair, planted_worker_command
from tls_certs import Ca

from pp1q.cli import main
from pp1q.runtime.capture import Direction, Kind, read_capture, write_records
from pp1q.runtime.launcher import DaemonProcess, pp1q_command
from pp1q.tools.chaos.faults import BitFlip, Disconnect, Drop, Duplicate, Rule
from pp1q.tools.chaos.proxy import ThreadedProxy
from pp1q.wire import MsgType, read_header

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

VOCAB = 64
# the Pair's worker settings; a later option wins (another preset or seed)
WORKER_ARGS = ["--vocab", str(VOCAB), "--model-seed", "0", "--draft-preset", "far",
               "--metrics-port", "0", "--speculation", "sampled"]
REQUESTS = [  # (prompt, max_tokens, options): every form of answer a worker sends
    ([1, 2, 3], 12, {"seed": 7}),  # sparse top-k 32: a REPLY per position
    ([4, 5], 10, {"seed": 8, "top_k": None, "draft_temperature": 0.8}),  # dense REPLYs
    ([9, 4], 8, {"seed": 10, "top_k": 4}),  # sparse top-k 4: one PROPOSAL a step
    ([6, 7, 8], 8, {"seed": 9, "temperature": 0.0}),  # greedy: token-only REPLYs
]


def _record(tmp, rules=None) -> None:
    """A toy session through both daemons, each capturing its side."""
    pair = Pair(tmp, vocab=VOCAB, rules=rules,
                worker_args=["--capture", str(tmp / "worker.pp1qcap")],
                verifier_args=["--capture", str(tmp / "verifier.pp1qcap")])
    try:
        client = pair.client()
        for prompt, n, options in REQUESTS:
            assert len(client.generate(prompt, n, **options)["token_ids"]) == n
        client.close()
    finally:
        pair.close()  # SIGTERM: each daemon closes its capture


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live_replay")
    _record(tmp)
    return tmp


@contextlib.contextmanager
def _proxied(worker, rules):
    """pp1q.tools.chaos's proxy in front of ``worker``, applying ``rules``: its HOST:PORT."""
    proxy = ThreadedProxy(int(worker.rsplit(":", 1)[1]))
    proxy.set_rules(rules)
    try:
        yield f"127.0.0.1:{proxy.port}"
    finally:
        proxy.stop()


@contextlib.contextmanager
def _worker(tmp, *args, cmd=None):
    """A worker daemon on an ephemeral port: its HOST:PORT."""
    n = len(list(tmp.glob("live*.log")))
    d = DaemonProcess("worker", [*(cmd or pp1q_command("worker")), "--listen", "127.0.0.1:0",
                                 *WORKER_ARGS, *args], str(tmp / f"live{n}.log"))
    try:
        yield f"127.0.0.1:{d.port}"
    finally:
        d.stop()


@pytest.fixture
def live(capsys):
    """``pp1q replay PATH --worker WORKER EXTRA...`` in process: (status, stdout, stderr)."""
    def run(path, worker, *extra):
        code = main(["replay", str(path), "--worker", worker, *extra])
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


def test_the_same_worker_answers_every_step_alike(session, live):
    with _worker(session) as worker:
        for side in ("verifier", "worker"):  # either side's capture holds both directions
            rc, out, err = live(session / f"{side}.pp1qcap", worker, "--json")
            assert rc == 0, (side, out, err)
            report = json.loads(out)
            steps = report["steps"]
            assert report["ok"] and not report["divergences"], side
            assert steps["matched"] >= len(REQUESTS) and steps["diverged"] == 0, side
            assert steps["partial"] == 0 and steps["not sent"] == 0, side
        rc, out, _ = live(session / "verifier.pp1qcap", worker)
    assert rc == 0 and out.splitlines()[-1].startswith(f"# live worker {worker}: 1 connections")


def test_a_worker_drafting_wrong_q_diverges_on_the_q_row(session, live):
    """The planted worker (tests/support/planted_worker.py) samples each token at the
    STEP's temperature but ships q built at temperature 1: same tokens, other q."""
    with _worker(session, cmd=planted_worker_command()) as worker:
        rc, out, err = live(session / "verifier.pp1qcap", worker)
    assert rc == 1, (out, err)
    firsts = [ln for ln in out.splitlines() if ln.startswith("!! DIVERGENCE")]
    assert any("q row (token " in ln and ": captured q=" in ln for ln in firsts), out
    assert not any("token: captured" in ln for ln in firsts), out  # the tokens are right


def test_a_worker_with_another_preset_diverges_on_a_token(session, live):
    with _worker(session, "--draft-preset", "close") as worker:
        rc, out, err = live(session / "verifier.pp1qcap", worker)
    assert rc == 1, (out, err)
    first = next(ln for ln in out.splitlines() if ln.startswith("!! DIVERGENCE   slot 0:"))
    assert " s0 g1 r1 frame " in first and "token: captured " in first, out


def test_a_worker_of_another_model_refuses_the_session(session, live):
    with _worker(session, "--model-seed", "1") as worker:
        rc, out, err = live(session / "verifier.pp1qcap", worker)
    assert rc == 3 and err.strip().splitlines() == [
        f"pp1q replay: worker {worker} refused the session: wrong_identity: "
        "mismatched draft_id, target_id"], (out, err)


def test_a_silent_worker_is_named_after_the_wait(live):
    """A socket that listens (the kernel completes the connection) and never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        worker = f"127.0.0.1:{silent.getsockname()[1]}"
        rc, out, err = live(_capture_of_session(), worker, "--wait-s", "0.5")
    assert rc == 3 and err.strip() == (f"pp1q replay: worker {worker} silent: no answer to "
                                       "the HELLO within 0.5 s (--wait-s)"), (out, err)


def test_nothing_listening_is_unreachable(live):
    with socket.socket() as s:  # a port just free
        s.bind(("127.0.0.1", 0))
        worker = f"127.0.0.1:{s.getsockname()[1]}"
    rc, out, err = live(_capture_of_session(), worker)
    assert rc == 3 and err.startswith(f"pp1q replay: worker {worker} unreachable: "), err
    assert len(err.strip().splitlines()) == 1


def _capture_of_session():
    """A capture with a HELLO (the checked-in vector: its target is no daemon's, which
    does not matter to a worker that never answers)."""
    import capture_vectors
    return capture_vectors.DATA_DIR / "clean_v2.pp1qcap"


def test_a_reply_corrupted_on_the_way_is_checked_by_its_claimed_checksum(session, tmp_path,
                                                                         live):
    """A REPLY whose payload a bit flip corrupted between the worker and the capturing
    verifier (the capture's record checksums hold: the flip came before it): the live
    worker's intact REPLY is compared by all the rest and by the checksum the captured
    header claims, and counted. It was a divergence that blamed the worker."""
    header, recs = read_capture(session / "verifier.pp1qcap")
    inbound = [i for i, r in enumerate(recs)
               if r.kind is Kind.DATA and r.direction is Direction.IN]
    stream = b"".join(recs[i].body for i in inbound)  # one connection: the worker's frames
    at = 0
    while (h := read_header(stream, at)).mtype != MsgType.REPLY or not h.payload_len:
        at += h.frame_bytes
    flip = at + h.frame_bytes - 1  # the first REPLY's last q byte
    for i in inbound:
        body = recs[i].body
        if flip < len(body):
            flipped = body[:flip] + bytes([body[flip] ^ 0x40]) + body[flip + 1:]
            recs[i] = dataclasses.replace(recs[i], body=flipped)
            break
        flip -= len(body)
    write_records(tmp_path / "bad.pp1qcap", header, recs)
    with _worker(session) as worker:
        rc, out, err = live(tmp_path / "bad.pp1qcap", worker)
    assert rc == 0, (out, err)
    assert not [ln for ln in out.splitlines() if ln.startswith("!! DIVERGENCE")]
    assert out.splitlines()[-1].endswith("; 1 captured payloads were corrupted on the way, "
                                         "checked by the checksums their headers claim")


def test_a_fallback_replays_cut_short_not_diverged(tmp_path, live):
    """The first COMPLETION dropped on the way: the verifier's capture has the step's
    REPLYs, its watchdog's RESET and a target-only token; the live worker sends the
    whole answer, compared as far as the capture shows it."""
    _record(tmp_path, rules=[Rule(Drop(), msg_type=MsgType.COMPLETION)])
    with _worker(tmp_path) as worker:
        rc, out, err = live(tmp_path / "verifier.pp1qcap", worker, "--json")
    assert rc == 0, (out, err)
    steps = json.loads(out)["steps"]
    assert steps["partial"] == 1 and steps["diverged"] == 0 and steps["matched"] > 0, steps


def test_a_worker_behind_mutual_tls_replays_with_a_client_certificate(session, tmp_path, live):
    """A worker that requires mutual TLS: the replay with a certificate of its CA matches
    every step; without one the worker drops the plain connection (3); a worker whose
    certificate another CA signed is refused by the replay's handshake (3)."""
    ca, other = Ca(tmp_path / "ca"), Ca(tmp_path / "other", "other-ca")
    client = ca.issue("replay", server=False)
    with _worker(session, *ca.issue("worker", server=True).args()) as worker:
        rc, out, err = live(session / "verifier.pp1qcap", worker, *client.args())
        assert rc == 0 and ", 0 diverged, " in out.splitlines()[-1], (out, err)
        rc, out, err = live(session / "verifier.pp1qcap", worker, "--wait-s", "2")
        assert rc == 3 and err.startswith(f"pp1q replay: worker {worker} "), (out, err)
        assert "before answering the HELLO; a worker serving mutual TLS" in err, err
    with _worker(session, *other.issue("worker", server=True).args()) as worker:
        rc, out, err = live(session / "verifier.pp1qcap", worker, *client.args())
    assert rc == 3 and err.startswith(f"pp1q replay: worker {worker}: TLS handshake "
                                      "failed: "), (out, err)
    rc, out, err = live(session / "verifier.pp1qcap", "127.0.0.1:1", "--tls-cert",
                        str(client.cert))
    assert rc == 2 and "mutual TLS needs tls_cert, tls_key and tls_ca" in err, err


# -- how a replay ends otherwise ----------------------------------------------------------


def test_a_worker_gone_with_an_answer_due_is_exit_three(session, live):
    """The connection reset in the middle of slot 0's third REPLY (the proxy's
    disconnect): what the worker sent is compared, then the answer due is named."""
    with _worker(session) as worker, _proxied(worker, [
            Rule(Disconnect(), msg_type=MsgType.REPLY, nth=3)]) as proxied:
        rc, out, err = live(session / "verifier.pp1qcap", proxied, "--wait-s", "2")
    assert rc == 3 and err.strip() == (f"pp1q replay: worker {proxied} closed the connection "
                                       "before answering STEP s0 g1 r1"), (out, err)


def test_bytes_corrupted_on_the_way_from_the_worker_diverge(session, live):
    """A header bit flipped breaks the live stream (a connection divergence, named
    first); a payload bit flipped fails that frame's check (the step's divergence)."""
    with _worker(session) as worker:
        with _proxied(worker, [Rule(BitFlip(region="control"), msg_type=MsgType.REPLY,
                                    nth=3)]) as proxied:
            rc, out, err = live(session / "verifier.pp1qcap", proxied, "--wait-s", "2")
        assert rc == 1, (out, err)
        assert out.splitlines()[0].startswith(
            "!! DIVERGENCE   connection: c1: the live worker's stream does not decode after 3 "
            "frames: checksum_mismatch"), out
        with _proxied(worker, [Rule(BitFlip(), msg_type=MsgType.REPLY, nth=3)]) as proxied:
            rc, out, err = live(session / "verifier.pp1qcap", proxied, "--wait-s", "2")
    assert rc == 1, (out, err)
    assert out.splitlines()[0] == ("!! DIVERGENCE   slot 0: c1 s0 g1 r1 frame 3: the live "
                                   "REPLY #3's payload fails its check (checksum_mismatch)")


def test_a_port_that_is_not_a_workers_is_exit_three(live):
    """An SSH server's banner where a HELLO_ANSWER should be."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        worker = f"127.0.0.1:{server.getsockname()[1]}"

        def banner():
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                conn.recv(1 << 16)

        thread = threading.Thread(target=banner, daemon=True)
        thread.start()
        rc, out, err = live(_capture_of_session(), worker, "--wait-s", "2")
        thread.join(5)
    assert rc == 3 and err.strip() == (f"pp1q replay: worker {worker} does not speak pp1q "
                                       "wire v2: its first bytes do not decode (bad_magic: "
                                       "magic b'SSH-')"), (out, err)


def test_a_capture_that_breaks_part_way_is_exit_two(session, tmp_path, live):
    """Garbage inside the captured worker stream, and the file cut inside a record: each
    replayed up to there, the break named on stderr (exit 2; garbage where the HELLO
    begins too, where nothing can be replayed); a cut file read with
    --allow-truncated is a capture that ends there (exit 0, a warning)."""
    header, recs = read_capture(session / "verifier.pp1qcap")
    i = next(i for i, r in enumerate(recs) if r.kind is Kind.DATA
             and r.direction is Direction.IN and i > len(recs) // 2)
    garbled = [*recs[:i], dataclasses.replace(recs[i], body=b"XXXX" * 8 + recs[i].body),
               *recs[i + 1:]]
    write_records(tmp_path / "garbled.pp1qcap", header, garbled)
    write_records(tmp_path / "cut.pp1qcap", header, recs)
    j = next(j for j, r in enumerate(recs) if r.kind is Kind.DATA
             and r.direction is Direction.OUT)  # the HELLO's record
    write_records(tmp_path / "no_hello.pp1qcap", header,
                  [*recs[:j], dataclasses.replace(recs[j], body=b"XXXX" * 8 + recs[j].body),
                   *recs[j + 1:]])
    with open(tmp_path / "cut.pp1qcap", "r+b") as f:
        f.truncate(recs[i].offset + 16)
    with _worker(session) as worker:
        rc, out, err = live(tmp_path / "garbled.pp1qcap", worker)
        assert rc == 2 and not out.startswith("!!"), (out, err)
        assert out.splitlines()[-1].endswith("; the capture breaks part-way: compared up to "
                                             "there"), out
        assert err.strip() == (f"pp1q replay: {tmp_path / 'garbled.pp1qcap'}: c1: the "
                               f"captured W>V stream does not decode (record {i} at byte "
                               f"{recs[i].offset}): bad_magic: magic b'XXXX'; replayed up "
                               "to there"), err
        rc, out, err = live(tmp_path / "cut.pp1qcap", worker)
        assert rc == 2 and err.strip() == (
            f"pp1q replay: {tmp_path / 'cut.pp1qcap'}: truncated record header (16 of 32 "
            f"bytes) (record {i} at byte {recs[i].offset}); replayed up to there"), err
        rc, out, err = live(tmp_path / "no_hello.pp1qcap", worker)  # nothing replayed
        assert rc == 2 and "c1: the captured V>W stream does not decode" in err, (out, err)
        rc, out, err = live(tmp_path / "cut.pp1qcap", worker, "--allow-truncated")
    assert rc == 0 and "warning: truncated record header" in err, (out, err)


def test_a_worker_with_other_limits_diverges_at_the_handshake_only(session, live):
    """A narrower sparse support (still above every top-k the session used): the
    HELLO_ANSWER differs by name, every step is still compared, and matches."""
    with _worker(session, "--max-support", "32") as worker:
        rc, out, err = live(session / "verifier.pp1qcap", worker, "--json")
    assert rc == 1, (out, err)
    report = json.loads(out)
    assert [d["what"] for d in report["divergences"]] == [
        "HELLO_ANSWER limits: max_support captured 64, live 32; sparse_row_bytes captured "
        "512, live 256"]
    assert report["steps"]["diverged"] == 1 and report["steps"]["matched"] >= len(REQUESTS)


def test_network_copies_in_a_chaos_capture_are_not_divergences(tmp_path, live):
    """A REPLY, a COMPLETION and a PROPOSAL each delivered twice to the verifier: its
    capture holds the copies, counted and not compared; the worker's capture of the
    same session has none."""
    _record(tmp_path, rules=[Rule(Duplicate(), msg_type=t, nth=2)
                             for t in (MsgType.REPLY, MsgType.COMPLETION, MsgType.PROPOSAL)])
    with _worker(tmp_path) as worker:
        rc, out, err = live(tmp_path / "verifier.pp1qcap", worker, "--json")
        assert rc == 0, (out, err)
        report = json.loads(out)
        assert report["copies"] >= 1 and report["steps"]["diverged"] == 0, report
        # the same worker: the first replay's close waited for the worker's, which
        # released the session both captures name (test_replay_live_close)
        rc, out, err = live(tmp_path / "worker.pp1qcap", worker, "--json")
    assert rc == 0 and json.loads(out)["copies"] == 0, (out, err)
