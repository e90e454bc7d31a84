"""The worker's PROPOSAL (wire v2 revision 3): ``WorkerEndpoint.send_proposal`` writes a
sparse step's every row in one frame, byte for byte the frame of ``send_parts`` and
``encode`` of ``proposal_from_rows`` for the same rows, whether the worker checks its
own rows or not; and it refuses (LocalProtocolError, with the reason the verifier would
give) to send what the verifier would refuse, leaving the step as it was."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from wire_helpers import SESSION, assert_ready, context_frame, drafted, proposal_for, step, stepped
from wire_vectors import LIMITS

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.q import build_row
from pp1q.wire import Form, Reset, SlotState, encode, proposal_from_rows
from pp1q.wire.proposal import row_checksum
from pp1q.wire.sizes import proposal_fits

SPARSE = step(top_k=3, depth=3)  # 3 rows of <= 3 entries: 72 payload bytes, fits in 80


@pytest.mark.parametrize("check_outgoing", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_send_proposal_is_the_message_frame_byte_for_byte(check_outgoing, seed):
    st = step(slot=seed % 4, round_id=1 + seed, depth=1 + seed % 3, top_k=1 + seed % 3,
              seed=seed)
    _, w = stepped(st, check_outgoing)
    _, w2 = stepped(st, check_outgoing)
    tokens, rows = drafted(st, seed)
    prop = proposal_for(st, seed)
    numpy_ints = [np.int64(t) for t in tokens] if seed % 2 else tokens  # a drafter's ints
    got = w.send_proposal(st, numpy_ints, rows)
    assert got == b"".join(w2.send_parts(prop)) == encode(prop)
    a, b = w.slots[st.slot], w2.slots[st.slot]  # both booked what the COMMIT will check
    assert a.drafts == b.drafts == tokens and a.reply_bytes == b.reply_bytes == len(got)
    assert a.checksums == b.checksums == prop.row_checksums


# -- refusals by the worker ---------------------------------------------------------------


def _refused(send, reason: Reason, cls: type = LocalProtocolError) -> None:
    with pytest.raises(cls) as e:
        send()
    assert e.value.reason is reason, e.value


@pytest.mark.parametrize("check_outgoing", [True, False])
def test_the_worker_refuses_to_send_what_the_verifier_would_refuse(check_outgoing):
    v, w = stepped(SPARSE, check_outgoing)
    tokens, rows = drafted(SPARSE)
    deeper_tokens, deeper_rows = drafted(step(top_k=3, depth=4))
    _refused(lambda: w.send_proposal(SPARSE, tokens[:2], rows[:2]), Reason.UNEXPECTED_SIZE)
    _refused(lambda: w.send_proposal(SPARSE, deeper_tokens, deeper_rows), Reason.UNEXPECTED_SIZE)
    zero = next(t for t in range(16) if rows[1].count_of(t) == 0)
    # never a token its own q could not draw: our own bug, a local error like the rest
    _refused(lambda: w.send_proposal(SPARSE, [tokens[0], zero, tokens[2]], rows),
             Reason.ZERO_Q_AT_TOKEN)
    wide = build_row(np.arange(16.0), top_k=4)  # 4 entries: within max_support, above top_k
    _refused(lambda: w.send_proposal(SPARSE, [int(wide.ids[-1]), *tokens[1:]], [wide, *rows[1:]]),
             Reason.SUPPORT_TOO_LARGE)
    _refused(lambda: w.send_proposal(SPARSE, [tokens[0] + 0.5, *tokens[1:]], rows),
             Reason.MALFORMED_CONTROL)  # a token id is an integer, never cut to one
    # the refusals changed nothing: the proposal still goes, once
    [ready] = v.receive_data(w.send_proposal(SPARSE, tokens, rows), 0.0)
    assert_ready(ready, SPARSE, tokens, rows)
    _refused(lambda: w.send_proposal(SPARSE, tokens, rows), Reason.STALE_GENERATION)


@pytest.mark.parametrize("check_outgoing", [True, False])
def test_a_proposal_with_an_empty_row_is_refused_by_name(check_outgoing):
    """Built elsewhere, its row checksum right for the empty row: the worker's own checks
    refuse it in the closed set (missing_q, as parse_sparse refuses an empty row), and
    without them the verifier's decoder does, before buffering it."""
    v, w = stepped(SPARSE, check_outgoing)
    prop = proposal_for(SPARSE, 0)
    ids, q = np.empty(0, np.int32), np.empty(0, np.float32)
    empty = msgspec.structs.replace(
        prop, entries=[0, *prop.entries[1:]], ids=(ids, *prop.ids[1:]), q=(q, *prop.q[1:]),
        row_checksums=[row_checksum(ids, q), *prop.row_checksums[1:]])
    if check_outgoing:
        _refused(lambda: w.send_parts(empty), Reason.MISSING_Q)
        return
    [failed] = v.receive_data(b"".join(w.send_parts(empty)), 0.0)
    assert failed.reason is Reason.MISSING_Q


def test_the_worker_refuses_tokens_and_rows_of_unequal_count():
    _, w = stepped(SPARSE)
    tokens, rows = drafted(SPARSE)
    _refused(lambda: w.send_proposal(SPARSE, tokens, rows[:2]), Reason.UNEXPECTED_SIZE)


@pytest.mark.parametrize("check_outgoing", [True, False])
@pytest.mark.parametrize("st,reason", [
    (step(top_k=3, depth=5), Reason.FRAME_TOO_LARGE),  # 120 bytes > 80: answered row by row
    (step(top_k=0, depth=3), Reason.FRAME_TOO_LARGE),  # dense: row by row
    (step(temperature=0.0, depth=3), Reason.MISSING_Q),  # greedy: no rows to carry
], ids=["sparse, not fitting", "dense", "greedy"])
def test_the_worker_refuses_a_proposal_for_a_step_answered_row_by_row(check_outgoing, st,
                                                                      reason):
    assert not proposal_fits(st, LIMITS)
    _, w = stepped(st, check_outgoing)
    tokens, rows = drafted(st)
    _refused(lambda: w.send_proposal(st, tokens, rows), reason)
    assert w.slots[0].state is SlotState.DRAFTING and not w.slots[0].checksums


@pytest.mark.parametrize("check_outgoing", [True, False])
def test_the_worker_refuses_a_proposal_after_a_reply_or_a_reset(check_outgoing):
    v, w = stepped(SPARSE, check_outgoing)
    tokens, rows = drafted(SPARSE)
    w.send_row(SPARSE, 1, tokens[0], rows[0], Form.SPARSE)
    _refused(lambda: w.send_proposal(SPARSE, tokens, rows), Reason.OUT_OF_ORDER)
    w.receive_data(v.send(Reset(session=SESSION, slot=0, generation=1,
                                reason=Reason.STEP_TIMEOUT)), 0.0)
    w.receive_data(v.send(context_frame(0, generation=2)), 0.0)
    again = step(generation=2, top_k=3, depth=3)
    _refused(lambda: w.send_proposal(again, tokens, rows), Reason.STALE_GENERATION)  # no STEP
    w.receive_data(v.send(again, now=0.0), 0.0)
    _refused(lambda: w.send_proposal(SPARSE, tokens, rows), Reason.STALE_GENERATION)  # reset
    tokens, rows = drafted(again)
    [ready] = v.receive_data(w.send_proposal(again, tokens, rows), 0.0)
    assert_ready(ready, again, tokens, rows)


def test_a_proposal_built_elsewhere_is_checked_like_one_built_here():
    """``send(Proposal)`` (a third party's message) gets the same checks as send_proposal."""
    v, w = stepped(SPARSE)
    prop = proposal_for(SPARSE)
    bad = msgspec.structs.replace(prop, row_checksums=[*prop.row_checksums[:2], 1])
    _refused(lambda: w.send(bad), Reason.CHECKSUM_MISMATCH)
    short = proposal_from_rows(session=SESSION, slot=0, generation=1, round_id=1,
                               first_position=SPARSE.first_position, context_version=0,
                               tokens=prop.tokens[:2], rows=drafted(SPARSE)[1][:2])
    _refused(lambda: w.send(short), Reason.UNEXPECTED_SIZE)
    [ready] = v.receive_data(w.send(prop), 0.0)
    assert_ready(ready, SPARSE, *drafted(SPARSE))
