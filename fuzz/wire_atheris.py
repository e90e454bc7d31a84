"""libFuzzer harness (atheris) for the wire decoder and the verifier endpoint.

Runs outside CI (docs/wire.md, section 8):

    pip install atheris
    python fuzz/wire_atheris.py -runs=1000000 -rss_limit_mb=2048 fuzz/corpus

A corpus directory given on the command line is created and seeded with the golden
vectors (tests/vectors/*.bin). Any exception other than RemoteProtocolError is a crash.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import wire_vectors  # noqa: E402

from pp1q.wire import (  # noqa: E402
    FrameDecoder,
    RemoteProtocolError,
    Step,
    VerifierEndpoint,
    WireConfig,
    WorkerEndpoint,
)

_CONFIG = WireConfig(identity=wire_vectors.IDENTITY, limits=wire_vectors.LIMITS, versions=(1, 2))


def _stepping_verifier() -> VerifierEndpoint:
    """A verifier past HELLO with one dense and one sparse step outstanding."""
    v = VerifierEndpoint(_CONFIG, session=wire_vectors.SESSION)
    w = WorkerEndpoint(_CONFIG)
    w.receive_data(v.hello(), 0.0)
    v.receive_data(w.data_to_send(), 0.0)
    base = dict(wire_vectors.STEP, temperature=0.75)
    v.send(Step(**{**base, "top_k": 0}), now=0.0)
    v.send(Step(**{**base, "slot": 1, "top_k": 3}), now=0.0)
    return v


def one_input(data: bytes) -> None:
    """The property: every input is accepted or raises RemoteProtocolError."""
    cut = data[0] if data else 0
    for chunks in ([data], [data[:cut], data[cut:]]):
        d = FrameDecoder(wire_vectors.LIMITS)
        try:
            for c in chunks:
                d.feed(c)
        except RemoteProtocolError:
            pass
    v = _stepping_verifier()
    try:
        v.receive_data(data, 0.0)
        v.check_timeouts(10.0)
    except RemoteProtocolError:
        pass


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
    atheris.instrument_all()  # coverage feedback for every loaded module (pp1q, msgspec glue)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
