"""libFuzzer harness (atheris) for every decoder a peer's bytes reach.

Targets, all fed the same input (each must accept it or raise RemoteProtocolError):

- ``FrameDecoder`` whole and split at a cut chosen by the first byte;
- a verifier past HELLO with a dense and a sparse STEP outstanding (twice: the golden
  vectors' slot 2 holds the dense step in one, the sparse one, which a PROPOSAL answers,
  in the other), fed through
  ``receive_data`` and through the BufferedProtocol path (``get_buffer`` /
  ``buffer_updated``, which the daemons use), then its watchdog; every ProposalReady it
  hands out for a sampled step must carry one q row per sampled id;
- a verifier waiting for the HELLO answer (identity, version and limit checks);
- a fresh worker (HELLO parsing, revision and identity checks) and a worker past HELLO
  (CONTEXT / STEP / COMMIT / RESET checks), and one that also holds a context on slot 1
  (so STEPs, COMMITs and appending CONTEXTs get past the context checks).

The wire targets also get the input with every frame's checksums recomputed
(``with_valid_checksums``): otherwise nearly every mutation stops at the head checksum.

Runs outside CI (RELIABILITY.md, "Fuzzing", records the last long run):

    pip install atheris
    python fuzz/wire_atheris.py -runs=1000000 -max_len=4096 -rss_limit_mb=2048 \
        -print_final_stats=1 fuzz/corpus

A corpus directory given on the command line is created and seeded with the golden
vectors (tests/vectors/*.bin), CONTEXT frames included. Any exception other than
RemoteProtocolError (or a failed assertion) is a crash: libFuzzer stops and saves it.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

import wire_vectors  # noqa: E402

from pp1q.core import q_backend  # noqa: E402
from pp1q.wire import (  # noqa: E402
    FrameDecoder,
    ProposalReady,
    RemoteProtocolError,
    Step,
    VerifierEndpoint,
    WireConfig,
    WorkerEndpoint,
)
from pp1q.wire.framing import HEADER_BYTES, reseal  # noqa: E402

_CONFIG = WireConfig(identity=wire_vectors.IDENTITY, limits=wire_vectors.LIMITS, versions=(1, 2))
_HELLO = VerifierEndpoint(_CONFIG, session=wire_vectors.SESSION).hello()
_HELLO_ANSWER = wire_vectors.build()["hello_answer"]  # the worker's answer to _HELLO
# each step set: a dense and a sparse STEP (top_k the vectors' own: a PROPOSAL fits it),
# the vectors' slot (2) given to one, then to the other
_STEP_SETS = tuple(
    (Step(**{**wire_vectors.STEP, "temperature": 0.75, "slot": dense, "top_k": 0}),
     Step(**{**wire_vectors.STEP, "temperature": 0.75, "slot": sparse,
             "top_k": wire_vectors.SPARSE_TOP_K}))
    for dense, sparse in ((2, 1), (1, 2)))
_MAX_CHUNK = 64  # BufferedProtocol path: at most this many bytes per buffer_updated call


def _ready_worker() -> WorkerEndpoint:
    w = WorkerEndpoint(_CONFIG)
    w.receive_data(_HELLO, 0.0)
    w.data_to_send()
    return w


def _worker_with_context() -> WorkerEndpoint:
    w = _ready_worker()
    w.receive_data(wire_vectors.build()["context"], 0.0)
    w.data_to_send()
    return w


def _stepping_verifier(steps) -> VerifierEndpoint:
    """A verifier past HELLO with ``steps`` (a dense and a sparse one) outstanding."""
    v = VerifierEndpoint(_CONFIG, session=wire_vectors.SESSION)
    v.hello()
    v.receive_data(_HELLO_ANSWER, 0.0)
    for step in steps:
        v.send(step, now=0.0)
    return v


def _check_events(events) -> None:
    for e in events:
        if isinstance(e, ProposalReady) and not e.greedy:  # no sampled id without its q
            assert len(e.q_rows) == len(e.draft_ids), e


def _buffered(endpoint, data: bytes) -> list:
    """Feed ``data`` as an asyncio.BufferedProtocol transport would: into get_buffer()."""
    events, pos = [], 0
    chunk = 1 + data[-1] % _MAX_CHUNK if data else 1  # the input picks its own chunking
    while pos < len(data):
        buf = endpoint.get_buffer(-1)
        n = min(len(buf), len(data) - pos, chunk)
        buf[:n] = data[pos:pos + n]
        pos += n
        events += endpoint.buffer_updated(n, 0.0)
    return events


def _only_remote_errors(fn, *args) -> None:
    with contextlib.suppress(RemoteProtocolError):
        fn(*args)


def with_valid_checksums(data: bytes) -> bytes:
    """``data`` read as a run of frames, each with both checksums recomputed over the
    bytes that are there, so that mutations reach the schema, row and state checks
    behind the head checksum (the CRC fix-up of PNG fuzzers). Declared lengths are kept."""
    out, pos = bytearray(data), 0
    while pos + HEADER_BYTES <= len(out):
        pos = reseal(out, pos)
    return bytes(out)


def _feed_all(decoder: FrameDecoder, chunks) -> None:
    for c in chunks:
        decoder.feed(c)


def _frame_decoder(data: bytes) -> None:
    cut = data[0] if data else 0
    for chunks in ([data], [data[:cut], data[cut:]]):
        _only_remote_errors(_feed_all, FrameDecoder(wire_vectors.LIMITS), chunks)


def _verifier(data: bytes) -> None:
    for steps in _STEP_SETS:
        v = _stepping_verifier(steps)
        _only_remote_errors(lambda v=v: _check_events(v.receive_data(data, 0.0)))
        _check_events(v.check_timeouts(10.0))
        v = _stepping_verifier(steps)
        _only_remote_errors(lambda v=v: _check_events(_buffered(v, data)))
    v = VerifierEndpoint(_CONFIG, session=wire_vectors.SESSION)
    v.hello()
    _only_remote_errors(v.receive_data, data, 0.0)


def _worker(data: bytes) -> None:
    for w in (WorkerEndpoint(_CONFIG), _ready_worker(), _worker_with_context()):
        _only_remote_errors(w.receive_data, data, 0.0)
        w.data_to_send()


TARGETS = (_frame_decoder, _verifier, _worker)


def one_input(data: bytes) -> None:
    """The property: every target accepts the input or raises RemoteProtocolError,
    as sent and with its frame checksums made valid."""
    for target in TARGETS:
        target(data)
    fixed = with_valid_checksums(data)
    if fixed != data:
        for target in TARGETS:
            target(fixed)


def _seed_corpus(argv: list[str]) -> None:
    dirs = [a for a in argv[1:] if not a.startswith("-")]
    if dirs:
        corpus = Path(dirs[0])
        corpus.mkdir(parents=True, exist_ok=True)
        for name, frame in wire_vectors.build().items():
            (corpus / f"{name}.bin").write_bytes(frame)


def main() -> None:
    import atheris  # only here: CI runs one_input directly, without libFuzzer

    _seed_corpus(sys.argv)
    # the row kernels compiled first: numba compiles a function from its bytecode, and
    # after instrument_all that bytecode calls atheris (a TypingError on a cold numba
    # cache, or once a kernel's source changed; every signature the targets use is here)
    q_backend.warm_up()
    atheris.instrument_all()  # coverage feedback for every loaded module (pp1q, msgspec glue)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
