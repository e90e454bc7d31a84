"""Checked-in captures (tests/data) replayed against the verifier endpoint: same commits,
same failures; corrupted copies are refused with the right reason."""

import dataclasses
import json

import capture_vectors
import msgspec
import numpy as np
import pytest
import xxhash
from capture_edits import rechunk

from pp1q.core.errors import Reason
from pp1q.runtime.capture import Direction, Kind, read_capture, write_records
from pp1q.tools.replay import Flow, decode, replay_verifier, target_from_identity
from pp1q.wire import HEADER_BYTES, MAGIC, Form, MsgType, read_header
from pp1q.wire.events import Discarded
from pp1q.wire.framing import reseal

DATA = capture_vectors.DATA_DIR
NAMES = capture_vectors.NAMES


def _expected(name):
    return json.loads((DATA / f"{name}.json").read_text())


def _cap(name):
    return DATA / f"{name}.pp1qcap"


def test_checked_in_captures_are_what_the_generator_builds(tmp_path):
    for name in NAMES:
        exp = capture_vectors.build(name, tmp_path)
        assert exp == _expected(name), name
        # a byte difference here is a wire or capture format change: bump the version
        assert (tmp_path / f"{name}.pp1qcap").read_bytes() == _cap(name).read_bytes(), name


@pytest.mark.parametrize("name", NAMES)
def test_replay_reproduces_commits_and_failures(name):
    exp = _expected(name)
    report = replay_verifier(_cap(name))
    assert report.ok, report.divergences
    assert [c.as_json() for c in report.commits] == exp["commits"]
    assert [{"slot": f.slot, "generation": f.generation, "round_id": f.round_id,
             "reason": f.reason.value} for f in report.failures] == exp["failures"]
    assert len(report.ready) == exp["proposals_ready"]
    assert not report.stream_errors


def _types_by_slot(name) -> dict[int, set[MsgType]]:
    """slot -> the types of the worker's frames for it (REPLY, COMPLETION, PROPOSAL)."""
    _, recs = read_capture(_cap(name))
    out: dict[int, set[MsgType]] = {}
    for r in recs:
        t = _frame_type(r)
        if r.direction is Direction.IN and t in (MsgType.REPLY, MsgType.COMPLETION,
                                                 MsgType.PROPOSAL):
            out.setdefault(_control(r.body)[1], set()).add(MsgType(t))
    return out


def test_the_vectors_cover_what_they_claim():
    fb = _expected("fallback_v2")
    assert {f["reason"] for f in fb["failures"]} == {"checksum_mismatch", "missing_q",
                                                     "step_timeout", "zero_q_at_token"}
    # slot 2 answers with PROPOSALs: one corrupt, one naming a token of q 0, one lost
    assert sorted(f["reason"] for f in fb["failures"] if f["slot"] == 2) == [
        "checksum_mismatch", "step_timeout", "zero_q_at_token"]
    assert fb["discarded"] > 0  # late frames of invalidated generations
    late = {h.event.msg_type for h in replay_verifier(_cap("fallback_v2")).events
            if isinstance(h.event, Discarded)}
    assert late == {MsgType.PROPOSAL, MsgType.REPLY, MsgType.COMPLETION}
    assert _expected("greedy_v1")["wire_version"] == 1
    assert _expected("clean_v2")["wire_version"] == 2
    ready = replay_verifier(_cap("greedy_v1")).ready
    assert ready and all(r.greedy and not r.q_rows for r in ready)
    forms = {len(r.replies[0].q) if r.replies[0].ids is None else "sparse"
             for r in replay_verifier(_cap("clean_v2")).ready}
    assert forms == {capture_vectors.VOCAB, "sparse"}  # dense and sparse rows
    # a sparse step answered whole (PROPOSAL) and one answered row by row (top-k 12: too
    # wide for one frame at vocabulary 64), beside dense rows
    rows, whole = {MsgType.REPLY, MsgType.COMPLETION}, {MsgType.PROPOSAL}
    assert _types_by_slot("clean_v2") == {0: rows, 1: whole}
    assert _types_by_slot("fallback_v2") == {0: rows, 1: rows, 2: whole}


@pytest.mark.parametrize("name", NAMES)
def test_every_round_decided_again_gives_the_captured_commit(name):
    exp = _expected(name)
    target = target_from_identity(exp["target_id"])
    report = replay_verifier(_cap(name), target=target)
    assert report.ok, report.divergences
    assert report.rechecked == len(exp["commits"])


def test_a_forged_commit_is_caught_by_redeciding(tmp_path):
    """The verifier commits a token its own round did not produce: the endpoint's checks
    cannot see it (the COMMIT is well formed), re-deciding does."""
    header, recs = read_capture(_cap("clean_v2"))
    i = next(i for i, r in enumerate(recs) if _frame_type(r) == MsgType.COMMIT)
    frame = bytearray(recs[i].body)
    from pp1q.wire import Commit, FrameDecoder, encode
    commit = FrameDecoder().feed(bytes(frame))[0]
    forged = encode(msgspec.structs.replace(commit, token=(commit.token + 1) % 64))
    recs[i] = dataclasses.replace(recs[i], body=forged)
    write_records(tmp_path / "f", header, recs)
    assert isinstance(commit, Commit)
    plain = replay_verifier(tmp_path / "f")
    assert plain.ok  # well-formed, so only re-deciding finds it
    report = replay_verifier(tmp_path / "f", target=target_from_identity(
        _expected("clean_v2")["target_id"]))
    assert not report.ok
    assert "re-decided" in report.divergences[0].what


# -- chunking does not matter ------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_replay_is_independent_of_record_boundaries(tmp_path, size):
    header, recs = read_capture(_cap("fallback_v2"))
    write_records(tmp_path / "r", header, rechunk(recs, size))
    report = replay_verifier(tmp_path / "r")
    assert report.ok
    assert [c.as_json() for c in report.commits] == _expected("fallback_v2")["commits"]
    assert [f.reason.value for f in report.failures] == [
        f["reason"] for f in _expected("fallback_v2")["failures"]]


# -- corrupted copies --------------------------------------------------------------------


def _frame_type(rec):
    if (rec.kind is not Kind.DATA or len(rec.body) < HEADER_BYTES
            or rec.body[:len(MAGIC)] != MAGIC):
        return None
    return read_header(rec.body).mtype


def _control(body: bytes) -> list:
    """A frame's control part as its msgpack array (the fields in wire order)."""
    return msgspec.msgpack.decode(body[HEADER_BYTES:HEADER_BYTES + read_header(body).control_len])


def _first_reply(recs, sparse: bool):
    """(record index, payload offset, entries) of the first dense or sparse REPLY."""
    want = Form.SPARSE if sparse else Form.DENSE
    for i, r in enumerate(recs):
        if r.direction is Direction.IN and _frame_type(r) == MsgType.REPLY:
            head = _control(r.body)  # ... index, position, token, form, entries
            if head[7] == want:
                return i, HEADER_BYTES + read_header(r.body).control_len, head[8]
    raise AssertionError("no such reply")


def _first_proposal(recs) -> int:
    return next(i for i, r in enumerate(recs)
                if r.direction is Direction.IN and _frame_type(r) == MsgType.PROPOSAL)


def _rechecksum(frame: bytearray) -> bytes:
    reseal(frame)
    return bytes(frame)


# a sparse step that fits one frame is answered by one PROPOSAL: clean_v2's sparse slot is;
# fallback_v2's slot 1 (top-k 12) is answered row by row
SPARSE_REPLIES = "fallback_v2"


def _corrupt(tmp_path, name, sparse, mutate, fix_checksums):
    header, recs = read_capture(_cap(name))
    i, payload_at, n = _first_reply(recs, sparse)
    frame = bytearray(recs[i].body)
    q_at = payload_at + (4 * n if sparse else 0)  # sparse: ids first, then q
    q = np.frombuffer(bytes(frame[q_at:q_at + 4 * n]), dtype="<f4")
    mutate(frame, q_at + 4 * int(np.flatnonzero(q > 0)[0]))
    body = _rechecksum(frame) if fix_checksums else bytes(frame)
    recs[i] = dataclasses.replace(recs[i], body=body)  # the capture stays well formed
    write_records(tmp_path / "bad.pp1qcap", header, recs)
    return replay_verifier(tmp_path / "bad.pp1qcap")


def _flip_low_byte(frame, at):
    frame[at] ^= 0x01


def _flip_sign(frame, at):
    frame[at + 3] ^= 0x80


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_flipped_q_byte_fails_the_proposal_with_checksum_mismatch(tmp_path, sparse):
    name = SPARSE_REPLIES if sparse else "clean_v2"
    report = _corrupt(tmp_path, name, sparse, _flip_low_byte, fix_checksums=False)
    assert report.failures[0].reason is Reason.CHECKSUM_MISMATCH
    assert report.failures[0].round_id == 1
    assert not report.ok  # the captured COMMIT of that round is refused now
    assert report.divergences[0].reason is Reason.STATE_NOT_ALLOWED
    slot = report.failures[0].slot
    assert (slot, 1) not in {(c.slot, c.round_id) for c in report.commits}


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_flipped_q_byte_with_fixed_checksums_fails_row_validation(tmp_path, sparse):
    name = SPARSE_REPLIES if sparse else "clean_v2"
    report = _corrupt(tmp_path, name, sparse, _flip_sign, fix_checksums=True)
    assert report.failures[0].reason is Reason.NEGATIVE_VALUE
    assert not report.ok


# -- a corrupted PROPOSAL: three checks in turn catch one flipped q bit -------------------


def _corrupt_proposal(tmp_path, mutate, *, reseal_frame: bool, row_sums: bool):
    """clean_v2 with its first PROPOSAL's first positive q value of row 2 mutated;
    ``reseal_frame``: its frame checksums recomputed; ``row_sums``: its row checksums too."""
    header, recs = read_capture(_cap("clean_v2"))
    i = _first_proposal(recs)
    body = recs[i].body
    head = _control(body)  # session, slot, generation, round, first, version, tokens, entries, sums
    payload = bytearray(body[HEADER_BYTES + read_header(body).control_len:])
    entries = head[7]
    row2 = 8 * entries[0]  # rows in order, each its ids then its q
    q = np.frombuffer(bytes(payload[row2 + 4 * entries[1]:row2 + 8 * entries[1]]), "<f4")
    mutate(payload, row2 + 4 * entries[1] + 4 * int(np.flatnonzero(q > 0)[0]))
    if row_sums:
        at, sums = 0, []
        for n in entries:
            sums.append(xxhash.xxh3_64_intdigest(bytes(payload[at:at + 8 * n])))
            at += 8 * n
        head[8] = sums
    frame = bytearray(body[:HEADER_BYTES] + msgspec.msgpack.encode(head) + payload)
    assert len(frame) == len(body)  # same control length: the header still holds
    if reseal_frame:
        reseal(frame)
    recs[i] = dataclasses.replace(recs[i], body=bytes(frame))
    write_records(tmp_path / "p.pp1qcap", header, recs)
    return replay_verifier(tmp_path / "p.pp1qcap")


def test_flipped_q_byte_in_a_proposal_fails_it_by_the_frame_checksum(tmp_path):
    report = _corrupt_proposal(tmp_path, _flip_low_byte, reseal_frame=False, row_sums=False)
    [failed] = report.failures
    assert failed.reason is Reason.CHECKSUM_MISMATCH and "payload" in failed.detail
    assert (failed.slot, failed.round_id) == (1, 1)
    assert not report.ok and report.divergences[0].reason is Reason.STATE_NOT_ALLOWED
    assert (1, 1) not in {(c.slot, c.round_id) for c in report.commits}


def test_a_resealed_proposal_fails_by_its_row_checksum(tmp_path):
    """Frame checksums recomputed over the flipped byte: the row checksum in the control
    part (xxh3 of row 2's ids and q) still names the row."""
    report = _corrupt_proposal(tmp_path, _flip_low_byte, reseal_frame=True, row_sums=False)
    [failed] = report.failures
    assert failed.reason is Reason.CHECKSUM_MISMATCH and "row" in failed.detail
    assert not report.ok


def test_a_proposal_with_every_checksum_recomputed_fails_row_validation(tmp_path):
    report = _corrupt_proposal(tmp_path, _flip_sign, reseal_frame=True, row_sums=True)
    [failed] = report.failures
    assert failed.reason is Reason.NEGATIVE_VALUE
    assert not report.ok


def test_the_proposal_corruption_helper_changes_nothing_unmutated(tmp_path):
    """The helper itself (control re-encoded, row checksums recomputed, resealed) leaves
    a capture that replays as captured: the failures above are the mutation's."""
    report = _corrupt_proposal(tmp_path, lambda payload, at: None, reseal_frame=True,
                               row_sums=True)
    assert report.ok and not report.failures
    assert [c.as_json() for c in report.commits] == _expected("clean_v2")["commits"]


def test_dropped_proposal_record_leaves_its_step_open(tmp_path):
    """Nothing answers slot 1's first step: its captured COMMIT is refused (the step is
    still outstanding), and the next round's PROPOSAL, of a round this replay never
    stepped, breaks the stream."""
    header, recs = read_capture(_cap("clean_v2"))
    i = _first_proposal(recs)
    write_records(tmp_path / "d", header, recs[:i] + recs[i + 1:])
    report = replay_verifier(tmp_path / "d")
    first = report.divergences[0]
    assert first.reason is Reason.STATE_NOT_ALLOWED and "COMMIT" in first.what
    assert report.stream_errors[0].event.reason is Reason.STATE_NOT_ALLOWED
    assert (1, 1) not in {(c.slot, c.round_id) for c in report.commits}


def test_dropped_reply_record_fails_out_of_order(tmp_path):
    header, recs = read_capture(_cap("clean_v2"))
    i, _, _ = _first_reply(recs, sparse=False)
    write_records(tmp_path / "d", header, recs[:i] + recs[i + 1:])
    report = replay_verifier(tmp_path / "d")
    assert report.failures[0].reason is Reason.OUT_OF_ORDER
    assert not report.ok


def test_garbage_in_the_worker_stream_breaks_it_with_bad_magic(tmp_path):
    header, recs = read_capture(_cap("clean_v2"))
    i, _, _ = _first_reply(recs, sparse=False)
    recs[i] = dataclasses.replace(recs[i], body=b"XXXX" + recs[i].body[4:])
    write_records(tmp_path / "g", header, recs)
    report = replay_verifier(tmp_path / "g")
    assert report.stream_errors[0].event.reason is Reason.BAD_MAGIC
    assert {f.reason for f in report.failures} == {Reason.BAD_MAGIC}  # open steps fail
    assert not report.ok


def test_frames_before_a_break_in_their_record_still_decode():
    """Garbage after the record that holds both first STEPs: they decode, then the
    stream's error, whatever the record boundaries (the frames a record held before
    the bytes that broke it were dropped with them)."""
    header, recs = read_capture(_cap("clean_v2"))
    i = next(i for i, r in enumerate(recs)
             if r.direction is Direction.OUT and _frame_type(r) == MsgType.STEP)
    recs[i] = dataclasses.replace(recs[i], body=recs[i].body + b"XXXX" * 8)

    def to_worker(records):
        items = [i for i in decode(header.role, records) if i.flow is Flow.TO_WORKER]
        upto = next(k for k, i in enumerate(items) if i.what == "error")
        return [(i.what, type(i.message).__name__) for i in items[:upto + 1]]

    whole = to_worker(recs)
    assert whole[-3:] == [("frame", "Step"), ("frame", "Step"), ("error", "NoneType")]
    assert to_worker(rechunk(recs, 1)) == whole


def test_sampled_step_inside_a_v1_capture_is_refused(tmp_path):
    from pp1q.wire import FrameDecoder, encode
    header, recs = read_capture(_cap("greedy_v1"))
    i = next(i for i, r in enumerate(recs) if _frame_type(r) == MsgType.STEP)
    steps = FrameDecoder().feed(recs[i].body)
    body = b"".join(encode(msgspec.structs.replace(s, temperature=1.0)) for s in steps)
    recs[i] = dataclasses.replace(recs[i], body=body)
    write_records(tmp_path / "v1", header, recs)
    report = replay_verifier(tmp_path / "v1")
    assert report.divergences[0].reason is Reason.SAMPLED_ON_V1


def test_step_timeout_comes_from_the_capture_or_the_caller():
    no_watchdog = replay_verifier(_cap("fallback_v2"), step_timeout=1e9)
    assert Reason.STEP_TIMEOUT not in {f.reason for f in no_watchdog.failures}
    assert no_watchdog.ok  # a RESET of a step still open is legal


def test_a_revision_two_session_is_a_divergence_by_name(tmp_path):
    """Revision 2 had no PROPOSAL; its HELLO (the same layout) is refused by name, as the
    worker refuses it, not replayed as if it were this revision."""
    from pp1q.wire import FrameDecoder, Hello, encode
    header, recs = read_capture(_cap("clean_v2"))
    i = next(i for i, r in enumerate(recs) if _frame_type(r) == MsgType.HELLO)
    [hello] = FrameDecoder().feed(recs[i].body)
    assert isinstance(hello, Hello) and hello.revision == 3
    recs[i] = dataclasses.replace(recs[i], body=encode(msgspec.structs.replace(hello,
                                                                               revision=2)))
    write_records(tmp_path / "r2", header, recs)
    report = replay_verifier(tmp_path / "r2")
    assert report.divergences[0].reason is Reason.BAD_REVISION
    assert "revision 2" in report.divergences[0].what
