"""A dense REPLY fed whole is checked while it is copied into its pooled buffer
(q_backend.copy_scanned, Frame.q_checked); fed in pieces it is copied piecewise and
scanned afterwards. Both ways, under both checkers, a proposal gets the same verdict
and the same first reason; a lying copy check (planted through the same seam the
decoder calls) is caught by that comparison."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from wire_helpers import SESSION, context_frame, step
from wire_vectors import IDENTITY

from pp1q.core import q_backend
from pp1q.core.q import build_row, sample
from pp1q.core.rng import proposal_u24
from pp1q.wire import (
    Discarded,
    Form,
    FrameDecoder,
    Limits,
    ProposalFailed,
    ProposalReady,
    Reason,
    VerifierEndpoint,
    WireConfig,
    WorkerEndpoint,
    reply_from_row,
)
from pp1q.wire.pool import POOL_MIN_BYTES

V = 20_000  # a dense payload over the pool's floor: copied out whole into a pooled buffer
DENSE_LEN = V + 16  # with padding beyond the vocabulary
assert 4 * V > POOL_MIN_BYTES
LIMITS = Limits.make(vocab=V, max_slots=1, max_depth=1, max_support=4, max_inflight=1,
                     dense_len=DENSE_LEN)
CONFIG = WireConfig(identity=msgspec.structs.replace(IDENTITY, vocab=V), limits=LIMITS,
                    versions=(2,))
CHECKERS = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(
    q_backend.importlib.util.find_spec("numba") is None, reason="numba not installed"))]
ST = step(depth=1)


def _row_and_token():
    row = build_row(np.random.default_rng(7).normal(size=V) * 2.0, temperature=0.8)
    return row, sample(row, proposal_u24(ST.seed, 1, 1, ST.first_position))


def _bad(name: str, q: np.ndarray, token: int) -> np.ndarray:
    q = q.copy()
    big = int(np.argmax(q))
    zero = int(np.flatnonzero(q[:V] == 0)[0])  # temperature 0.8 over 20k ids: many zeros
    if name == "nan":
        q[V // 2] = np.nan
    elif name == "negative zero":
        q[zero] = np.float32(-0.0)
    elif name == "non-dyadic":  # a zero entry: 2^-30 added to a large one rounds away
        q[zero] = np.float32(2.0**-30)
    elif name == "mass short":
        q[big] -= np.float32(2.0**-24)
    elif name == "padding":
        q[V + 3] = np.float32(2.0**-24)
        q[big] -= np.float32(2.0**-24)  # the mass over the whole payload stays exact
    elif name == "zero at token":
        q[big] += q[token]
        q[token] = 0
    return q


CASES = {"valid": None, "nan": Reason.NON_FINITE, "negative zero": Reason.NEGATIVE_VALUE,
         "non-dyadic": Reason.NON_DYADIC, "mass short": Reason.WRONG_MASS,
         "padding": Reason.PADDING_NONZERO, "zero at token": Reason.ZERO_Q_AT_TOKEN}


def _frames(name: str) -> tuple[bytes, bytes]:
    """(answer to the verifier's HELLO, the step's REPLY + COMPLETION) from a worker
    that does not check what it sends."""
    v = VerifierEndpoint(CONFIG, session=SESSION)
    w = WorkerEndpoint(CONFIG, check_outgoing=False)
    w.receive_data(v.hello(), 0.0)
    answer = w.data_to_send()
    v.receive_data(answer, 0.0)
    w.receive_data(v.send(context_frame(0)), 0.0)
    w.receive_data(v.send(ST, now=0.0), 0.0)
    row, token = _row_and_token()
    reply = reply_from_row(session=SESSION, slot=0, generation=1, round_id=1, index=1,
                           position=ST.first_position, token=token, row=row, form=Form.DENSE,
                           dense_len=DENSE_LEN)
    reply = msgspec.structs.replace(reply, q=_bad(name, reply.q, token))
    return answer, w.send(reply) + w.send(w.completion(0))


def _verdict(answer: bytes, frames: bytes, chunk: int | None):
    v = VerifierEndpoint(CONFIG, session=SESSION)
    v.hello()
    v.receive_data(answer, 0.0)
    v.send(ST, now=0.0)
    pieces = [frames] if chunk is None else [frames[i:i + chunk]
                                             for i in range(0, len(frames), chunk)]
    e, *rest = [e for p in pieces for e in v.receive_data(p, 0.0)]
    assert all(isinstance(r, Discarded) for r in rest)  # the COMPLETION of a failed step
    if isinstance(e, ProposalReady):
        return ("ready", e.q_rows[0].counts.sum())
    assert isinstance(e, ProposalFailed)
    return ("failed", e.reason)


@pytest.fixture(params=CHECKERS)
def checker(request):
    before = q_backend.select(request.param)
    yield request.param
    q_backend.select(before)


@pytest.mark.parametrize("name", list(CASES))
def test_whole_and_piecewise_feeds_decide_alike(checker, name):
    answer, frames = _frames(name)
    whole = _verdict(answer, frames, None)
    assert whole == _verdict(answer, frames, 4096)  # copied piecewise, scanned after
    assert whole == (("ready", 1 << 24) if CASES[name] is None else ("failed", CASES[name]))


def test_only_a_whole_dense_payload_under_numba_is_checked_while_copied(checker):
    _, frames = _frames("valid")
    [f, _] = FrameDecoder(LIMITS).feed_frames(frames)  # REPLY, COMPLETION
    assert f.error is None and f.q_checked is (checker == "numba")
    d = FrameDecoder(LIMITS)
    pieced = [g for i in range(0, len(frames), 4096) for g in d.feed_frames(frames[i:i + 4096])]
    assert not pieced[0].q_checked and pieced[0].error is None


def test_a_lying_copy_check_is_caught_by_the_comparison(checker, monkeypatch):
    """Planted: copy_scanned says every value passed whatever it copied. A bad row fed
    whole is then accepted while the piecewise feed refuses it: the comparison above
    fails for such a bug."""
    def liar(dst, src):
        dst[:] = src
        return True

    monkeypatch.setattr(q_backend, "copy_scanned", liar)
    answer, frames = _frames("mass short")
    assert _verdict(answer, frames, None) == ("ready", (1 << 24) - 1)
    assert _verdict(answer, frames, 4096) == ("failed", Reason.WRONG_MASS)

