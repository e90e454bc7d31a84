"""Checked-in captures (tests/data) replayed against the verifier endpoint: same commits,
same failures; corrupted copies are refused with the right reason."""

import dataclasses
import json

import capture_vectors
import msgspec
import numpy as np
import pytest

from pp1q.core.errors import Reason
from pp1q.runtime.capture import Direction, Kind, read_capture, write_records
from pp1q.tools.replay import replay_verifier, target_from_identity
from pp1q.wire import HEADER_BYTES, MAGIC, MsgType, read_header
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


def test_the_vectors_cover_what_they_claim():
    fb = _expected("fallback_v2")
    assert {f["reason"] for f in fb["failures"]} == {"checksum_mismatch", "missing_q",
                                                     "step_timeout"}
    assert fb["discarded"] > 0  # late frames of invalidated generations
    assert _expected("greedy_v1")["wire_version"] == 1
    assert _expected("clean_v2")["wire_version"] == 2
    ready = replay_verifier(_cap("greedy_v1")).ready
    assert ready and all(r.greedy and not r.q_rows for r in ready)
    forms = {len(r.replies[0].q) if r.replies[0].ids is None else "sparse"
             for r in replay_verifier(_cap("clean_v2")).ready}
    assert forms == {capture_vectors.VOCAB, "sparse"}  # dense and sparse rows


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


def _rechunk(records, size):
    out = []
    for r in records:
        if r.kind is not Kind.DATA:
            out.append(r)
            continue
        for k in range(0, len(r.body), size):
            out.append(dataclasses.replace(r, body=r.body[k:k + size]))
    return out


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_replay_is_independent_of_record_boundaries(tmp_path, size):
    header, recs = read_capture(_cap("fallback_v2"))
    write_records(tmp_path / "r", header, _rechunk(recs, size))
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


def _first_reply(recs, sparse: bool):
    for i, r in enumerate(recs):
        if r.direction is Direction.IN and _frame_type(r) == MsgType.REPLY:
            h = read_header(r.body)
            control_len, payload_len = h.control_len, h.payload_len
            entries_bytes = 8 if sparse else 4
            n = payload_len // entries_bytes
            if payload_len and (n != capture_vectors.VOCAB) == sparse:
                return i, HEADER_BYTES + control_len, n
    raise AssertionError("no such reply")


def _rechecksum(frame: bytearray) -> bytes:
    reseal(frame)
    return bytes(frame)


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
    report = _corrupt(tmp_path, "clean_v2", sparse, _flip_low_byte, fix_checksums=False)
    assert report.failures[0].reason is Reason.CHECKSUM_MISMATCH
    assert report.failures[0].round_id == 1
    assert not report.ok  # the captured COMMIT of that round is refused now
    assert report.divergences[0].reason is Reason.STATE_NOT_ALLOWED
    slot = report.failures[0].slot
    assert (slot, 1) not in {(c.slot, c.round_id) for c in report.commits}


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_flipped_q_byte_with_fixed_checksums_fails_row_validation(tmp_path, sparse):
    report = _corrupt(tmp_path, "clean_v2", sparse, _flip_sign, fix_checksums=True)
    assert report.failures[0].reason is Reason.NEGATIVE_VALUE
    assert not report.ok


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
