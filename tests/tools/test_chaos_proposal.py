"""The chaos tooling and PROPOSAL frames (wire revision 3), without daemons: the wire
audit records a PROPOSAL's positions and treats it as the step's totals; each frame
fault on a PROPOSAL ends, at a real VerifierEndpoint, in the verdict the chaos matrix's
sparse rows count (pp1q.tools.chaos.sparse_rows); and ``poisons`` says which faulted
PROPOSALs may still be committed (a duplicate or a stale replay: the copy is discarded,
the original stands); the sparse distribution row's accounting flags what it must; and
the rows that count discarded copies want them under the reason each must carry."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from wire_helpers import SESSION, drafted, pair, rows_for, step, stepped, worker_frames

from pp1q.core.errors import Reason
from pp1q.tools.chaos.audit import WireAudit, proposal_rows
from pp1q.tools.chaos.distribution import proposal_accounting
from pp1q.tools.chaos.faults import (
    BitFlip,
    Delay,
    Drop,
    Duplicate,
    FaultKind,
    Reorder,
    Replay,
    Truncate,
    poisons,
)
from pp1q.tools.chaos.frames import FrameCutter, Piece, flip_bit, truncate_reframed
from pp1q.tools.chaos.matrix import Deltas, cases
from pp1q.tools.chaos.sparse_rows import sparse_cases
from pp1q.tools.chaos.spec import parse_rule
from pp1q.wire import (
    Commit,
    Discarded,
    MsgType,
    Proposal,
    ProposalFailed,
    ProposalReady,
    Reset,
    SlotState,
    Step,
    encode,
)
from pp1q.wire.proposal import row_checksum
from pp1q.wire.sizes import proposal_fits

DEPTH, TOP_K = 3, 2  # a sparse step whose PROPOSAL fits the test limits (3 x 2 x 8 <= 80)


def _piece(data: bytes) -> Piece:
    (piece,) = FrameCutter().feed(data)
    return piece


# -- the audit ------------------------------------------------------------------------

def _step(depth=DEPTH, top_k=TOP_K) -> Step:
    return Step(session=5, slot=0, generation=1, round_id=1, last_committed=9,
                first_position=10, prefix_digest=0, depth=depth, temperature=1.0,
                top_k=top_k, context_version=0, seed=1)


def proposal(tokens=(2, 5, 7), q_at_token=0.25, zero_at=None) -> Proposal:
    """Every position a two-entry sparse row holding its token (q(token) 0.0 at
    position ``zero_at``)."""
    ids, q = [], []
    for i, token in enumerate(tokens, 1):
        at = 0.0 if i == zero_at else q_at_token
        ids.append(np.array(sorted((token, (token + 1) % 16)), dtype="<i4"))
        q.append(np.array([at, 1 - at] if ids[-1][0] == token else [1 - at, at], dtype="<f4"))
    return Proposal(session=5, slot=0, generation=1, round_id=1, first_position=10,
                    context_version=0, tokens=list(tokens), entries=[2] * len(tokens),
                    row_checksums=[row_checksum(a, b) for a, b in zip(ids, q, strict=True)],
                    ids=tuple(ids), q=tuple(q))


def _commit(accepted=1) -> Commit:
    return Commit(session=5, slot=0, generation=1, round_id=1, accepted=accepted, token=1,
                  committed=10 + accepted)


def _feed(audit: WireAudit, to_worker: bool, data: bytes, intact: bool = True) -> None:
    piece = _piece(data)
    audit.delivered(1, to_worker, piece, piece.message(), intact)


def _round(*deliveries, step_msg=None, commit=None) -> WireAudit:
    """STEP, then each (PROPOSAL frame bytes, intact) as delivered, then the COMMIT."""
    audit = WireAudit()
    _feed(audit, True, encode(step_msg or _step()))
    for data, intact in deliveries:
        _feed(audit, False, data, intact)
    _feed(audit, True, encode(commit or _commit()))
    return audit


def test_proposal_rows_reads_each_positions_q_at_its_token():
    data = encode(proposal(q_at_token=0.375, zero_at=2))
    assert proposal_rows(_piece(data), _piece(data).message()) == [(1, 0.375), (2, 0.0),
                                                                   (3, 0.375)]
    short = _piece(truncate_reframed(_piece(data), 4))  # a cut payload: no row is readable
    assert proposal_rows(short, short.message()) == [(1, 0.0), (2, 0.0), (3, 0.0)]


def test_audit_accepts_a_whole_intact_proposal_frame():
    a = _round((encode(proposal()), True))
    assert a.violations == [] and a.commits == 1 and a.proposal_commits == 1
    assert a.committed_drafts == 1 and a.sampled_rows == DEPTH and a.pending() == 0


@pytest.mark.parametrize("deliveries, why", [
    # the corrupted frame (what a payload bit flip delivers): neither rows nor totals
    ([(flip_bit(_piece(encode(proposal())), "payload", 5, 3), False)], "rows delivered"),
    ([(flip_bit(_piece(encode(proposal())), "payload", 5, 3), False)], "no intact"),
    ([(truncate_reframed(_piece(encode(proposal())), 4), False)], "without q"),
    ([(encode(proposal(zero_at=3)), True)], "rows [3] without q"),
    ([(encode(proposal(tokens=(2, 5))), True)], "rows delivered [(1, True), (2, True)]"),
    ([], "no intact COMPLETION or PROPOSAL"),  # the frame dropped, yet committed
])
def test_audit_flags_a_commit_of_a_broken_or_missing_proposal(deliveries, why):
    a = _round(*deliveries)
    assert why in " ".join(a.violations), a.violations


def test_audit_flags_a_proposal_frame_committed_for_a_dense_step():
    a = _round((encode(proposal()), True), step_msg=_step(top_k=0))
    assert a.violations == ["COMMIT slot 0 gen 1 round 1: a PROPOSAL answered a dense or "
                            "greedy step"]


def test_audit_ignores_a_copy_of_a_complete_proposal():
    """A duplicated PROPOSAL reaches the verifier after the original made the slot READY:
    it is discarded unread (test below), so the audit must not count its rows twice
    (rows 1..3 twice would be flagged, as a duplicated REPLY row is)."""
    frame = encode(proposal())
    a = _round((frame, True), (frame, True))
    assert a.violations == [] and a.commits == 1 and a.sampled_rows == DEPTH


@pytest.mark.parametrize("top_k, fits", [(0, False), (2, True), (4, False)])
def test_audit_counts_sparse_proposals_streamed_as_reply_rows(top_k, fits):
    """What the soak's streamed sparse check reads: a sparse step too large for one
    PROPOSAL (3 x 4 x 8 bytes > the test limits' 80) streams sparse REPLY rows and a
    COMPLETION, counted apart from a PROPOSAL's commit and from a dense step's."""
    st = step(depth=DEPTH, top_k=top_k)
    v, w = stepped(st)
    assert proposal_fits(st, w.limits) is fits
    sent = w.send_proposal(st, *drafted(st)) if fits else worker_frames(w, st)
    audit = WireAudit()
    _feed(audit, True, encode(st))
    for piece in FrameCutter().feed(sent):
        audit.delivered(1, False, piece, piece.message(), True)
    _feed(audit, True, encode(Commit(session=SESSION, slot=0, generation=1, round_id=1,
                                     accepted=0, token=1, committed=st.last_committed + 1)))
    assert audit.violations == [] and audit.commits == 1
    assert audit.proposal_commits == int(fits)
    assert audit.streamed_sparse_commits == int(top_k > 0 and not fits)


def test_audit_flags_a_commit_of_a_poisoned_proposal_and_forgets_on_reset():
    audit = WireAudit()
    _feed(audit, True, encode(_step()))
    piece = _piece(encode(proposal()))
    audit.poison(1, piece.message())
    audit.delivered(1, False, piece, piece.message(), True)
    _feed(audit, True, encode(_commit()))
    assert any("faulted" in v for v in audit.violations)
    audit = WireAudit()
    _feed(audit, True, encode(_step()))
    _feed(audit, False, encode(proposal()))
    _feed(audit, True, encode(Reset(session=5, slot=0, generation=1, reason="step_timeout")))
    assert audit.pending() == 0 and audit.violations == [] and audit.commits == 0


# -- each fault on a PROPOSAL, at the verifier ------------------------------------------

def _stepping():
    """A verifier with slot 0 stepping a sparse step, and the worker's PROPOSAL for it."""
    v, w = pair()
    st = step(depth=DEPTH, top_k=TOP_K)
    w.receive_data(v.send(st, now=0.0), 0.0)
    drawn = rows_for(st)
    frame = w.send_proposal(st, [t for t, _, _ in drawn], [r for _, r, _ in drawn])
    return v, st, frame


def test_an_intact_proposal_is_ready_at_once():
    v, _, frame = _stepping()
    [ev] = v.receive_data(frame, 0.0)
    assert isinstance(ev, ProposalReady) and len(ev.draft_ids) == DEPTH
    assert v.slots[0].state is SlotState.READY


@pytest.mark.parametrize("edit, reason", [
    (lambda p: flip_bit(p, "payload", 5, 3), Reason.CHECKSUM_MISMATCH),
    (lambda p: truncate_reframed(p, 4), Reason.UNEXPECTED_SIZE),
])
def test_a_corrupted_proposal_fails_its_step_and_only_it(edit, reason):
    """The chaos matrix's sparse bit-flip and truncate rows: one validation failure of
    this reason per injection (a frame-aligned error: the stream goes on)."""
    v, _, frame = _stepping()
    [ev] = v.receive_data(edit(_piece(frame)), 0.0)
    assert isinstance(ev, ProposalFailed) and ev.reason is reason and not ev.by_peer
    assert v.failures == {reason: 1} and v.state.value == "ready"


def test_a_dropped_proposal_leaves_the_step_to_the_watchdog():
    v, _, frame = _stepping()  # the frame never delivered
    [ev] = v.check_timeouts(v.step_timeout)
    assert ev.reason is Reason.STEP_TIMEOUT
    [late] = v.receive_data(frame, v.step_timeout)  # and if it comes after all: discarded
    assert isinstance(late, Discarded) and late.reason is Reason.STALE_GENERATION


def test_a_duplicated_proposal_is_discarded_and_the_original_stands():
    """Why ``poisons(Duplicate(), PROPOSAL)`` is False: the copy reaches the verifier
    after the original made the slot READY (the proxy writes both back to back) or after
    the COMMIT; either way it is discarded as duplicate_round, no failure, and the
    original proposal stays handed out."""
    v, st, frame = _stepping()
    ready, copy = v.receive_data(frame + frame, 0.0)
    assert isinstance(ready, ProposalReady)
    assert isinstance(copy, Discarded) and copy.reason is Reason.DUPLICATE_ROUND
    assert v.failures == {} and v.slots[0].state is SlotState.READY
    v.send(Commit(session=SESSION, slot=0, generation=1, round_id=1, accepted=1,
                  token=ready.draft_ids[1], committed=st.last_committed + 2))
    [again] = v.receive_data(frame, 0.0)  # after the COMMIT too
    assert isinstance(again, Discarded) and again.reason is Reason.DUPLICATE_ROUND
    v.send(Reset(session=SESSION, slot=0, generation=1, reason="cancelled"))
    [stale] = v.receive_data(frame, 0.0)  # a replay once the generation is dead
    assert isinstance(stale, Discarded) and stale.reason is Reason.STALE_GENERATION
    assert v.failures == {}


@pytest.mark.parametrize("fault, poisoning", [
    (Duplicate(), False), (Replay(), False),  # the copy is discarded, the original stands
    (Drop(), True), (BitFlip(), True), (Truncate(), True), (Reorder(), True),
    (Delay(3.0), True),  # the rules always delay past the watchdog
])
def test_which_faults_on_a_proposal_poison_it(fault, poisoning):
    assert poisons(fault, MsgType.PROPOSAL) is poisoning
    # a PROPOSAL is judged like the COMPLETION it plays, not like a REPLY row
    assert poisons(fault, MsgType.PROPOSAL) is poisons(fault, MsgType.COMPLETION)


# -- the sparse distribution row's accounting -------------------------------------------

def _deltas(invalid=5, watchdog=3, late=4, duplicates=2) -> Deltas:
    """``late`` frames discarded, ``duplicates`` of them as duplicate_round."""
    def discarded(reason: str) -> tuple:
        return "pp1q_late_replies_discarded_total", (("reason", reason),)
    after = {("pp1q_fallbacks_total", (("cause", "invalid_reply"),)): invalid,
             ("pp1q_fallbacks_total", (("cause", "watchdog_timeout"),)): watchdog,
             ("pp1q_watchdog_timeouts_total", ()): watchdog,
             discarded("duplicate_round"): duplicates,
             discarded("stale_generation"): late - duplicates}
    return Deltas({}, after)


INJECTED = {"bit_flip": 2, "truncate": 3, "duplicate": 2, "replay": 1, "delay": 1}
FIRED = Counter({FaultKind.DROP: 2, FaultKind.DELAY: 1})


@pytest.mark.parametrize("deltas, why", [
    (_deltas(), None),
    (_deltas(late=3), None),  # the delayed frame had not landed: 3 copies, 4 at most
    (_deltas(invalid=6), "invalid_reply"),  # a copy failed a step (as a REPLY row's does)
    (_deltas(watchdog=4), "watchdog_timeouts"),  # a stall the faults do not explain
    (_deltas(late=2), "late frames"),  # a copy not discarded
    (_deltas(duplicates=1), None),  # a duplicate whose original failed: its copy is stale
    (_deltas(duplicates=3), "duplicate_round"),  # a replay or a late frame counted a copy
])
def test_proposal_accounting_each_fault_ends_one_way(deltas, why):
    problems = proposal_accounting(deltas, INJECTED, FIRED)
    assert (problems == []) if why is None else why in " ".join(problems), problems


def test_a_fault_spec_can_name_the_proposal():
    rule = parse_rule("duplicate:proposal:every=4:times=0", random.Random(0))
    assert rule.msg_type is MsgType.PROPOSAL and isinstance(rule.fault, Duplicate)


# -- the rows that count copies check why each was discarded ----------------------------

def _late(reason: str, n: int = 3) -> Deltas:
    return Deltas({}, {("pp1q_late_replies_discarded_total", (("reason", reason),)): n})


@pytest.mark.parametrize("name, reason", [
    ("sparse: duplicate frame", "duplicate_round"),
    ("sparse: stale-generation replay", "stale_generation"),
    ("stale-generation replay", "stale_generation"),  # the dense row (a REPLY row's copy)
])
def test_a_copy_row_wants_its_discards_under_its_own_reason(name, reason):
    """The total alone would pass a copy discarded for the other reason (a stale replay
    taken for a duplicate, or the reverse): the row must not."""
    (case,) = [c for c in cases(1.0) + sparse_cases(1.0) if c.name == name]
    other = {"duplicate_round": "stale_generation", "stale_generation": "duplicate_round"}
    assert case.expect(_late(reason), 3) == []
    assert case.counter == f"late_replies_discarded{{{reason}}}"
    problems = case.expect(_late(other[reason]), 3)
    assert any(f"late_replies_discarded{{{reason}}} = 0, want 3" in p for p in problems)
