"""The worker's direct frames (issue 13): ``WorkerEndpoint.send_row`` writes a sparse
REPLY straight from its row, a dense one from the row's FP32 q (or a reused ZeroRow), and
``send_completion`` the step's COMPLETION, without building the messages. The bytes must
be exactly those of ``send_parts(reply_from_row)`` and ``send(completion)``, every form
and every row, and the same refusals must hold."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from wire_helpers import SESSION, pair, rows_for, step

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.q import build_row
from pp1q.wire import Reset, Status, reply_from_row
from pp1q.wire.events import ProposalReady
from pp1q.wire.pool import ZeroRow
from pp1q.wire.validate import step_form

SEEDS = 24  # rows of every support size the limits allow (1..4 of 16), many tokens


def _direct(w):
    w.check_outgoing = False  # the daemon's default: a sparse row takes the direct path
    return w


def _both(st):
    """Two worker endpoints in the same state, each holding ``st``, and the verifier;
    the first writes direct frames, the second builds messages (its own checks on)."""
    v, w = pair()
    _, w2 = pair()
    _direct(w)
    frame = v.send(st, now=0.0)
    w.receive_data(frame, 0.0)
    w2.receive_data(frame, 0.0)
    return v, w, w2


def _by_message(w, st, index, token, row):
    return b"".join(w.send_parts(reply_from_row(
        session=w.session, slot=st.slot, generation=st.generation, round_id=st.round_id,
        index=index, position=st.first_position + index - 1, token=token, row=row,
        form=step_form(st), dense_len=w.limits.dense_len)))


@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("top_k", [0, 1, 3, 4])
def test_direct_frames_are_the_message_frames_byte_for_byte(seed, top_k):
    greedy = seed % 7 == 6  # a v1 step now and then: token-only frames
    st = step(slot=seed % 4, round_id=1 + seed, depth=1 + seed % 5, seed=seed,
              top_k=0 if greedy else top_k, temperature=0.0 if greedy else 0.8)
    v, w, w2 = _both(st)
    direct, dense_row = [], ZeroRow()  # reused: each frame is joined before the next fill
    for i, (token, row, form) in enumerate(rows_for(st, seed), start=1):
        drafted = np.int64(token) if seed % 2 else token  # a drafter's numpy integer too
        if row is not None and seed % 3 == 1:  # a row given by its support only
            row = dataclasses.replace(row)  # (dense: scattered into the ZeroRow)
        got = b"".join(w.send_row(st, i, drafted, row, form, dense_row=dense_row))
        assert got == _by_message(w2, st, i, token, row)
        direct.append(got)
    done = w.send_completion(st.slot)
    assert done == w2.send(w2.completion(st.slot))
    [ready] = v.receive_data(b"".join(direct) + done, 0.0)
    assert isinstance(ready, ProposalReady)
    assert [int(x) for x in ready.draft_ids] == [tok for tok, _, _ in rows_for(st, seed)]


def test_an_aborted_completion_is_the_message_frame():
    st = step(top_k=3)
    _, w, w2 = _both(st)
    assert (w.send_completion(0, Status.ABORTED, Reason.ZERO_MASS)
            == w2.send(w2.completion(0, Status.ABORTED, Reason.ZERO_MASS)))


@pytest.mark.parametrize("top_k", [3, 0])  # sparse, dense (its reused ZeroRow given)
def test_direct_frames_keep_every_refusal(top_k):
    st = step(top_k=top_k)
    v, w = pair()
    _direct(w).receive_data(v.send(st, now=0.0), 0.0)
    (t1, r1, f), (t2, r2, _), *_ = rows_for(st)

    def send_row(index, token, row):
        return w.send_row(st, index, token, row, f, dense_row=ZeroRow())

    with pytest.raises(LocalProtocolError) as e:  # rows leave in order
        send_row(2, t2, r2)
    assert e.value.reason == Reason.OUT_OF_ORDER
    logits = np.where(np.arange(16) == 5, -np.inf, np.arange(16.0))  # q(5) = 0
    with pytest.raises(LocalProtocolError) as e:  # never a token its q could not draw
        send_row(1, 5, build_row(logits, top_k=top_k or None))
    assert e.value.reason == Reason.ZERO_Q_AT_TOKEN
    with pytest.raises(LocalProtocolError) as e:  # not before every row
        w.send_completion(0)
    assert e.value.reason == Reason.UNEXPECTED_SIZE
    with pytest.raises(LocalProtocolError) as e:  # a token id is an integer, never cut
        send_row(1, t1 + 0.5, r1)
    assert e.value.reason == Reason.MALFORMED_CONTROL
    send_row(1, t1, r1)  # the refusals changed nothing: row 1 still goes
    w.receive_data(v.send(Reset(session=SESSION, slot=0, generation=1,
                                reason=Reason.STEP_TIMEOUT)), 0.0)
    for send in (lambda: send_row(2, t2, r2), lambda: w.send_completion(0)):
        with pytest.raises(LocalProtocolError) as e:  # a reset step sends nothing more
            send()
        assert e.value.reason == Reason.STALE_GENERATION


def test_a_support_above_the_limit_is_refused_by_the_schema_or_the_peer():
    """The direct frame carries what the row holds; a row wider than max_support is
    refused when the verifier reads it (the worker's own checks, when on, refuse it first)."""
    st = step(top_k=4)
    v, w, w2 = _both(st)
    row = build_row(np.arange(16.0), top_k=8)  # 8 entries > max_support 4
    token = int(row.ids[-1])
    with pytest.raises(LocalProtocolError) as e:
        w2.send_row(st, 1, token, row, step_form(st))
    assert e.value.reason == Reason.SUPPORT_TOO_LARGE
    frame = b"".join(w.send_row(st, 1, token, row, step_form(st)))
    events = v.receive_data(frame, 0.0)
    assert any(getattr(ev, "reason", None) == Reason.SUPPORT_TOO_LARGE for ev in events), events
