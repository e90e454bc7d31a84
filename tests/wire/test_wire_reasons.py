"""One negative test per validation reason (issue 3's list), through the endpoints.

Row-level faults fail the whole proposal (ProposalFailed with the reason) and leave
the stream usable; faults that break the stream raise RemoteProtocolError.
"""

import msgspec
import numpy as np
import pytest
from wire_helpers import SESSION, pair, replies_for, step, stepped, worker_frames
from wire_vectors import LIMITS

from pp1q.wire import (
    Discarded,
    Form,
    LocalProtocolError,
    ProposalFailed,
    Reason,
    RemoteProtocolError,
    Reply,
    Reset,
    StepRefused,
    encode,
)

F = np.float32


def reply(st, index=1, token=2, form=Form.SPARSE, ids=None, q=None, **kw):
    q = None if q is None else np.asarray(q, F)
    ids = None if ids is None else np.asarray(ids, np.int32)
    entries = 0 if q is None else q.size
    fields = dict(session=SESSION, slot=st.slot, generation=st.generation,
                  round_id=st.round_id, index=index, position=st.first_position + index - 1,
                  token=token, form=int(form), entries=entries, ids=ids, q=q)
    fields.update(kw)
    return Reply(**fields)


def dense(values: dict, n=LIMITS.dense_len):
    q = np.zeros(n, F)
    for i, x in values.items():
        q[i] = x
    return q


SPARSE = step(top_k=3, depth=2)
DENSE = step(top_k=0, depth=2)
GREEDY = step(temperature=0.0, depth=2)
HALF = {2: 0.5, 5: 0.5}

ROW_FAULTS = [
    ("duplicate id", SPARSE, dict(ids=[2, 2, 5], q=[0.25, 0.25, 0.5]), Reason.DUPLICATE_ID),
    ("duplicate zeros", SPARSE, dict(ids=[2, 5, 5], q=[1.0, 0, 0]), Reason.DUPLICATE_ID),
    ("unsorted support", SPARSE, dict(ids=[5, 2], q=[0.5, 0.5]), Reason.UNSORTED_SUPPORT),
    ("zero entry in support", SPARSE, dict(ids=[2, 5], q=[1.0, 0.0]), Reason.NON_CANONICAL),
    ("padded id", SPARSE, dict(ids=[2, 17], q=[0.5, 0.5]), Reason.ID_OUT_OF_RANGE),
    ("negative id", SPARSE, dict(ids=[-1, 2], q=[0.5, 0.5]), Reason.ID_OUT_OF_RANGE),
    ("token out of vocab", SPARSE, dict(token=16, ids=[2, 5], q=[0.5, 0.5]),
     Reason.ID_OUT_OF_RANGE),
    ("negative token", SPARSE, dict(token=-1, ids=[2, 5], q=[0.5, 0.5]),
     Reason.ID_OUT_OF_RANGE),
    # the drafted token is range-checked in every reply form, before anything indexes a
    # row with it: a dense row padded to 20 must not answer for token 25 (IndexError) or
    # 17 (a padding entry), and a greedy reply has no row to catch token 1000 at all
    ("dense token out of vocab", DENSE, dict(token=25, form=Form.DENSE, q=dense(HALF)),
     Reason.ID_OUT_OF_RANGE),
    ("dense token in the padding", DENSE, dict(token=17, form=Form.DENSE, q=dense(HALF)),
     Reason.ID_OUT_OF_RANGE),
    ("dense negative token", DENSE, dict(token=-1, form=Form.DENSE, q=dense(HALF)),
     Reason.ID_OUT_OF_RANGE),
    ("greedy token out of vocab", GREEDY, dict(token=1000, form=Form.TOKEN_ONLY),
     Reason.ID_OUT_OF_RANGE),
    ("greedy token at vocab", GREEDY, dict(token=16, form=Form.TOKEN_ONLY),
     Reason.ID_OUT_OF_RANGE),
    ("greedy negative token", GREEDY, dict(token=-1, form=Form.TOKEN_ONLY),
     Reason.ID_OUT_OF_RANGE),
    ("missing q", SPARSE, dict(form=Form.TOKEN_ONLY), Reason.MISSING_Q),
    ("NaN", DENSE, dict(form=Form.DENSE, q=dense({2: np.nan, 5: 0.5})), Reason.NON_FINITE),
    ("inf", SPARSE, dict(ids=[2, 5], q=[np.inf, 0.5]), Reason.NON_FINITE),
    ("negative", DENSE, dict(form=Form.DENSE, q=dense({2: 0.75, 5: 0.5, 7: -0.25})),
     Reason.NEGATIVE_VALUE),
    ("non-dyadic", DENSE, dict(form=Form.DENSE, q=dense({2: 0.5, 5: 0.5 - 2**-24, 7: 2**-25})),
     Reason.NON_DYADIC),
    ("wrong mass", DENSE, dict(form=Form.DENSE, q=dense({2: 0.5, 5: 0.25})), Reason.WRONG_MASS),
    ("zero q at token", SPARSE, dict(token=7, ids=[2, 5], q=[0.5, 0.5]),
     Reason.ZERO_Q_AT_TOKEN),
    ("zero q at token (dense)", DENSE, dict(token=7, form=Form.DENSE, q=dense(HALF)),
     Reason.ZERO_Q_AT_TOKEN),
    ("dense padding", DENSE, dict(form=Form.DENSE, q=dense({2: 0.5, 5: 0.25, 18: 0.25})),
     Reason.PADDING_NONZERO),
    ("support above top_k", SPARSE, dict(ids=[1, 2, 3, 5], q=[0.25] * 4),
     Reason.SUPPORT_TOO_LARGE),
    ("form not the step's", SPARSE, dict(form=Form.DENSE, q=dense(HALF)),
     Reason.UNEXPECTED_SIZE),
    ("position", SPARSE, dict(ids=[2, 5], q=[0.5, 0.5], position=99), Reason.BAD_POSITION),
    ("out of order", SPARSE,
     dict(index=2, ids=[2, 5], q=[0.5, 0.5], position=SPARSE.last_committed + 2),
     Reason.OUT_OF_ORDER),
    ("depth", SPARSE,
     dict(index=3, ids=[2, 5], q=[0.5, 0.5], position=SPARSE.last_committed + 3),
     Reason.DEPTH_TOO_LARGE),
]


@pytest.mark.parametrize("name,st,change,reason", ROW_FAULTS, ids=[f[0] for f in ROW_FAULTS])
def test_row_fault_fails_the_whole_proposal(name, st, change, reason):
    v, _ = stepped(st)
    good = replies_for(st)[0] if "index" in change else None
    pre = encode(good) if good is not None and change["index"] > 2 else b""
    if pre:  # the depth case: both legal rows first
        pre += encode(replies_for(st)[1])
    evs = v.receive_data(pre + encode(reply(st, **change)), 0.0)
    assert evs == [ProposalFailed(st.slot, st.generation, st.round_id, reason, evs[0].detail)]
    assert v.failures[reason] == 1 and v.slots[st.slot].state.value == "failed"


def test_payload_checksum_mismatch_fails_the_proposal():
    v, w = stepped(SPARSE)
    frame = bytearray(encode(replies_for(SPARSE)[0]))
    frame[-1] ^= 0x01
    [ev] = v.receive_data(bytes(frame), 0.0)
    assert ev.reason == Reason.CHECKSUM_MISMATCH


def test_duplicate_reply_fails_the_proposal():
    v, _ = stepped(SPARSE)
    r = encode(replies_for(SPARSE)[0])
    [ev] = v.receive_data(r + r, 0.0)
    assert ev.reason == Reason.DUPLICATE_ROUND


@pytest.mark.parametrize("field,value,reason", [
    ("reply_checksum", 1, Reason.CHECKSUM_MISMATCH),
    ("reply_bytes", 1, Reason.UNEXPECTED_SIZE),
    ("rows", 1, Reason.UNEXPECTED_SIZE),
    ("context_version", 9, Reason.WRONG_IDENTITY),
    ("first_position", 1, Reason.BAD_POSITION),
])
def test_completion_must_match_what_arrived(field, value, reason):
    v, w = stepped(DENSE)
    frames = b"".join(w.send(r) for r in replies_for(DENSE))
    bad = msgspec.structs.replace(w.completion(DENSE.slot), **{field: value})
    [ev] = v.receive_data(frames + encode(bad), 0.0)
    assert ev.reason == reason


def test_completion_before_every_row_is_an_unexpected_size():
    v, w = stepped(DENSE)
    data = w.send(replies_for(DENSE)[0]) + encode(w.completion(DENSE.slot))
    [ev] = v.receive_data(data, 0.0)
    assert ev.reason == Reason.UNEXPECTED_SIZE


def test_stale_generation_is_discarded():
    v, w = stepped(DENSE)
    v.send(Reset(session=SESSION, slot=0, generation=1, reason=Reason.CANCELLED))
    evs = v.receive_data(worker_frames(w, DENSE), 0.0)
    assert {(type(e), e.reason) for e in evs} == {(Discarded, Reason.STALE_GENERATION)}


@pytest.mark.parametrize("change,reason", [
    (dict(session=SESSION + 1), Reason.WRONG_IDENTITY),
    (dict(slot=LIMITS.max_slots), Reason.SLOT_OUT_OF_RANGE),
    (dict(slot=1), Reason.STATE_NOT_ALLOWED),  # nothing outstanding on slot 1
    (dict(generation=5), Reason.STATE_NOT_ALLOWED),  # a generation never stepped
])
def test_stream_level_faults_raise(change, reason):
    v, _ = stepped(SPARSE)
    with pytest.raises(RemoteProtocolError) as e:
        v.receive_data(encode(reply(SPARSE, ids=[2, 5], q=[0.5, 0.5], **change)), 0.0)
    assert e.value.reason == reason


@pytest.mark.parametrize("change,reason", [
    (dict(slot=LIMITS.max_slots), Reason.SLOT_OUT_OF_RANGE),
    (dict(depth=LIMITS.max_depth + 1), Reason.DEPTH_TOO_LARGE),
    (dict(depth=0), Reason.DEPTH_TOO_LARGE),
    (dict(top_k=LIMITS.max_support + 1), Reason.SUPPORT_TOO_LARGE),
    (dict(first_position=3), Reason.BAD_POSITION),
    (dict(temperature=float("nan")), Reason.BAD_TEMPERATURE),
    (dict(temperature=-1.0), Reason.BAD_TEMPERATURE),
    (dict(temperature=0.0, top_k=2), Reason.BAD_TOP_K),
])
def test_worker_refuses_a_bad_step(change, reason):
    v, w = pair()
    [ev] = w.receive_data(encode(step(**change)), 0.0)
    assert isinstance(ev, StepRefused) and ev.reason == reason
    refusal = w.data_to_send()
    if change.get("slot") is None:  # the verifier maps the refusal onto its own step
        v.send(step(), now=0.0)
        [f] = v.receive_data(refusal, 0.0)
        assert f.reason == reason and f.by_peer and f.detail.startswith("peer:")


def test_worker_refuses_stale_and_duplicate_keys():
    v, w = pair()
    w.receive_data(v.send(step(generation=3), now=0.0), 0.0)
    [busy] = w.receive_data(encode(step(generation=3, round_id=2)), 0.0)
    assert busy.reason == Reason.STATE_NOT_ALLOWED  # the slot is still drafting
    [dup] = w.receive_data(encode(step(generation=3)), 0.0)
    assert dup.reason == Reason.DUPLICATE_ROUND
    w.receive_data(v.send(Reset(session=SESSION, slot=0, generation=3,
                                reason=Reason.CANCELLED)), 0.0)
    for gen, reason in ((3, Reason.STALE_GENERATION), (2, Reason.STALE_GENERATION)):
        [ev] = w.receive_data(encode(step(generation=gen, round_id=9)), 0.0)
        assert ev.reason == reason
    w.receive_data(encode(step(generation=4, round_id=2)), 0.0)
    w2 = pair()[1]
    st = step(generation=4, round_id=2)
    w2.receive_data(encode(st), 0.0)
    worker_frames(w2, st)
    w2.receive_data(encode(Reset(session=SESSION, slot=0, generation=3,
                                 reason=Reason.CANCELLED)), 0.0)  # older: no effect
    assert w2.slots[0].state.value == "completed"


def test_worker_refuses_a_duplicate_round():
    v, w = pair()
    st = step()
    w.receive_data(v.send(st, now=0.0), 0.0)
    v.receive_data(worker_frames(w, st), 0.0)
    from pp1q.wire import Commit

    w.receive_data(v.send(Commit(session=SESSION, slot=0, generation=1, round_id=1,
                                 accepted=0, token=1, committed=st.last_committed + 1)), 0.0)
    [ev] = w.receive_data(encode(step(last_committed=st.last_committed + 1)), 0.0)  # round 1 again
    assert ev.reason == Reason.DUPLICATE_ROUND


def test_worker_refuses_beyond_max_inflight():
    v, w = pair()
    for slot in range(LIMITS.max_inflight):
        w.receive_data(encode(step(slot=slot)), 0.0)
    assert w.inflight == LIMITS.max_inflight == LIMITS.max_slots
    small = msgspec.structs.replace(w.limits, max_inflight=2)
    w.limits = small
    w.receive_data(encode(Reset(session=SESSION, slot=3, generation=1,
                                reason=Reason.CANCELLED)), 0.0)
    [ev] = w.receive_data(encode(step(slot=3, generation=2)), 0.0)
    assert ev.reason == Reason.TOO_MANY_INFLIGHT


@pytest.mark.parametrize("cap", [1, 2, 3, LIMITS.max_slots])
def test_both_ends_hold_max_inflight_below_and_at_the_slot_count(cap):
    # the cap is counted only where it is below the slot count (Endpoint.at_inflight_cap):
    # at every cap the verifier sends, and the worker takes, exactly ``cap`` steps, and the
    # next is refused on either end (with cap == slots there is no next slot to try)
    v, w = pair()
    v.limits = w.limits = msgspec.structs.replace(v.limits, max_inflight=cap)
    for slot in range(cap):
        assert w.receive_data(v.send(step(slot=slot), now=0.0), 0.0)[0].step.slot == slot
    assert v.inflight == w.inflight == cap
    if cap == LIMITS.max_slots:
        return
    with pytest.raises(LocalProtocolError) as refused:
        v.send(step(slot=cap), now=0.0)
    assert refused.value.reason == Reason.TOO_MANY_INFLIGHT
    [ev] = w.receive_data(encode(step(slot=cap)), 0.0)
    assert ev.reason == Reason.TOO_MANY_INFLIGHT
