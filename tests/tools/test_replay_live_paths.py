"""How a live replay ends when something other than a drafted answer differs, on its
sans-IO core (tests/support/live_replay.py: live_core's commands, a simulated worker),
the live worker's bytes read a frame at a time and a byte at a time (the capture's
records then a byte each too): the worker closing the connection, with an answer due or
not; a capture that breaks part-way; a live stream that does not decode; a HELLO_ANSWER
with other limits; a frame captured twice (in a verifier's capture the network's copy,
in a worker's the worker's own repeat).

Each check is also run against a planted fault through the same seam (the matcher the
replay is given, or the function the live stream summarises frames with) and must fail
there: ``test_each_check_fails_on_its_planted_fault``."""

from __future__ import annotations

import dataclasses
import re

import capture_vectors
import msgspec
import pytest
from capture_edits import frames, rechunk, recorded_by, spliced, worker_streams
from live_replay import replay, self_replay

from pp1q.core.errors import Reason
from pp1q.runtime.capture import CaptureReader, Kind, Role, read_capture, write_records
from pp1q.tools.replay import answer_matcher, answers, decode, live_stream
from pp1q.tools.replay.answer_matcher import AnswerMatcher
from pp1q.tools.replay.step_match import Outcome, StepMatch
from pp1q.tools.replay.streams import Flow
from pp1q.wire import CONNECTION_SLOT, DEFAULT_LIMITS, Commit, FrameDecoder, Refusal, encode

PIECES = [None, 1]  # a frame (a record) a read, and a byte a read
NAME = "clean_v2"  # one connection: c1; slot 0 dense, a REPLY a position; slot 1 PROPOSALs


def _capture():
    header, recs = read_capture(capture_vectors.DATA_DIR / f"{NAME}.pp1qcap")
    return header, recs


def _worker():
    """The captured worker's frames, in order: [0] HELLO_ANSWER, [1] s0 g1 r1 REPLY #1,
    [2] s1 g1 r1 PROPOSAL, [3..6] s0 g1 r1 REPLY #2..#5, [7] its COMPLETION, [8] s0 g1
    r2 REPLY #1, ..."""
    header, recs = _capture()
    return frames(worker_streams(header.role, recs)[1])


def _run(piece, matcher=AnswerMatcher, *, live=None, recs=None, role=None, **kw):
    """The capture (``recs``, taken by ``role``: by default the vector's) against a worker
    sending ``live`` (default: what it captured)."""
    header, captured = _capture()
    recs = captured if recs is None else recs
    if live is not None:
        kw["live"] = {1: b"".join(live)}
    return self_replay(role or header.role, rechunk(recs, piece) if piece else recs,
                       piece=piece, matcher=matcher, **kw)


def _decoded(raw: bytes):
    """A worker frame's message, decoded with the session's limits (a dense row is the
    vocabulary long)."""
    hello = FrameDecoder(DEFAULT_LIMITS).feed(_worker()[0])[0]
    [frame] = FrameDecoder(hello.limits).feed_frames(raw)
    return frame.message


def _refusal(reason: Reason, detail: str) -> bytes:
    session = _decoded(_worker()[0]).session
    return encode(Refusal(session=session, slot=CONNECTION_SLOT, generation=0, round_id=0,
                          reason=reason, detail=detail))


def _steps(report) -> dict[str, int]:
    return {o.value: n for o, n in report.outcomes.items() if n}


# -- 1. the worker closes the connection --------------------------------------------------


def _check_close_with_an_answer_due(matcher, piece):
    w = _worker()
    r = _run(piece, matcher, live=w[:3], closes={1})  # HELLO_ANSWER, REPLY #1, PROPOSAL
    assert r.fatal == "closed the connection before answering STEP s0 g1 r1"


def _check_close_with_no_answer_due(matcher, piece):
    """Closed after its last answer: a note, every step matched. Closed after r1's
    answers: nothing due then, but the capture shows it answering r2 later."""
    r = _run(piece, matcher, closes={1})
    assert r.fatal is None and r.report.ok, r.report.lines()
    assert r.report.notes == ["c1: the worker closed the connection before the replay sent "
                              "its COMMIT s0 g1 r3, no answer due; nothing more was sent"]
    assert _steps(r.report) == {"matched": 6}
    r = _run(piece, matcher, live=_worker()[:8], closes={1})
    assert r.fatal == "closed the connection before answering STEP s0 g1 r2"


def _check_close_after_a_divergence(matcher, piece):
    """Its close follows from the divergence (exit 1, not 3): reported with it."""
    w = _worker()
    reply = _decoded(w[1])
    w[1] = encode(msgspec.structs.replace(reply, token=(reply.token + 1) % 64))
    r = _run(piece, matcher, live=w[:3], closes={1})
    assert r.fatal is None
    assert [d.describe() for d in r.report.divergences] == [
        f"c1 s0 g1 r1 frame 1 position 4: token: captured {reply.token}, live "
        f"{(reply.token + 1) % 64}",
        "c1: the worker closed the connection before answering STEP s0 g1 r1"]


def _check_a_session_refusal_is_named_refused_or_ended(matcher, piece):
    r = _run(piece, matcher, live=[_refusal(Reason.WRONG_IDENTITY, "mismatched draft_id")],
             closes={1})
    assert r.fatal == "refused the session: wrong_identity: mismatched draft_id"
    idle = _refusal(Reason.IDLE_TIMEOUT, "closed by the worker's bounds on its peers")
    r = _run(piece, matcher, live=[*_worker()[:3], idle], closes={1})
    assert r.fatal == ("ended the session: idle_timeout: closed by the worker's bounds on "
                       "its peers")


def test_a_worker_that_stops_answering_is_silent():
    """Part of an answer sent, then nothing, the connection still open: once the wait is
    over (the simulated worker has sent all it will) the answer due is named, exit 3."""
    for piece in PIECES:
        r = _run(piece, live=_worker()[:3])
        assert r.fatal == "silent: no answer to STEP s0 g1 r1 within 0 s (--wait-s)"


# -- 2. the capture breaks part-way -------------------------------------------------------


def _check_a_captured_stream_that_stops_decoding(matcher, piece):
    """Garbage inside each direction's captured stream, at a frame boundary: compared up
    to there, no divergence (the live worker did nothing wrong), the break named."""
    header, recs = _capture()
    w = _worker()
    at = len(w[0]) + len(w[1])  # after s0 g1 r1's REPLY #1
    bad = spliced(header.role, recs, 1, Flow.TO_VERIFIER, at, b"XXXX" * 8)
    r = _run(piece, matcher, recs=bad, live=w)  # the worker sent no garbage
    assert r.fatal is None and not r.report.divergences
    assert len(r.report.capture_errors) == 1, r.report.lines()
    [why] = r.report.capture_errors
    assert re.fullmatch(r"c1: the captured W>V stream does not decode \(record \d+ at byte "
                        r"\d+\): bad_magic: magic b'XXXX'", why), why
    assert _steps(r.report) == {"partial": 2}  # r1 of both slots, as far as captured
    sent = [i for i in decode(header.role, recs) if i.what == "frame"
            and i.flow is Flow.TO_WORKER]
    commit = next(k for k, i in enumerate(sent) if isinstance(i.message, Commit))
    at = sum(len(i.raw) for i in sent[:commit])  # the first COMMIT's first byte
    bad = spliced(header.role, recs, 1, Flow.TO_WORKER, at, b"XXXX" * 8)
    r = _run(piece, matcher, recs=bad)
    assert r.fatal is None and not r.report.divergences
    assert [e.split(" (")[0] for e in r.report.capture_errors] == [
        "c1: the captured V>W stream does not decode"]
    assert _steps(r.report) == {"matched": 2}  # both r1 answers, whole before the COMMIT


def test_a_capture_broken_before_its_hello_decodes_is_a_break():
    """Garbage where the captured HELLO begins: the connection cannot be replayed at all,
    and that is the capture breaking (exit 2), not a clean replay of nothing (it was:
    '0 connections', exit 0)."""
    header, recs = _capture()
    for piece in PIECES:
        bad = spliced(header.role, recs, 1, Flow.TO_WORKER, 0, b"XXXX" * 8)
        r = _run(piece, recs=bad)
        assert r.fatal is None and not r.report.ok and r.report.connections == 0
        assert [e.split(" (")[0] for e in r.report.capture_errors] == [
            "c1: the captured V>W stream does not decode"]


def _check_a_capture_file_cut_part_way(matcher, piece, tmp_path):
    """The file ends inside a record: without --allow-truncated the reader's error is
    the break (compared up to there); with it, the cut is a capture that ends there."""
    header, recs = _capture()
    recs = rechunk(recs, piece) if piece else recs
    path = tmp_path / f"cut{piece}.pp1qcap"
    write_records(path, header, recs)
    cut = next(r for r in CaptureReader(path) if r.kind is Kind.DATA
               and r.offset > path.stat().st_size // 2)
    with open(path, "r+b") as f:
        f.truncate(cut.offset + 16)  # inside its record header
    live = worker_streams(header.role, recs)
    r = replay(header.role, CaptureReader(path), piece=piece, matcher=matcher, live=live)
    assert r.fatal is None and not r.report.divergences
    assert r.report.capture_errors == [
        f"truncated record header (16 of 32 bytes) (record {cut.index} at byte "
        f"{cut.offset})"]
    assert r.report.outcomes[Outcome.MATCHED] >= 1
    reader = CaptureReader(path, allow_truncated=True)
    r = replay(header.role, reader, piece=piece, matcher=matcher, live=live)
    assert r.report.ok and reader.truncated is not None


# -- 3. the live stream does not decode ---------------------------------------------------


def _check_not_the_wire(matcher, piece):
    """Another service's port (a web server answering the HELLO's bytes): exit 3."""
    r = _run(piece, matcher, live=[b"HTTP/1.1 400 Bad Request\r\n\r\n"], closes={1})
    assert r.fatal == ("does not speak pp1q wire v2: its first bytes do not decode "
                       "(bad_magic: magic b'HTTP')")


def test_a_first_frame_that_does_not_frame_is_not_the_wire():
    """The magic, then a HELLO_ANSWER whose header checksum fails: no session to compare
    against, exit 3 as for another service's port (docs/capture.md, section 3)."""
    w = _worker()
    head = bytearray(w[0])
    head[33] ^= 0x01  # a control byte: the header's checksum covers it
    for piece in PIECES:
        r = _run(piece, live=[bytes(head), *w[1:]])
        assert r.fatal == ("does not speak pp1q wire v2: its first bytes do not decode "
                           "(checksum_mismatch: header/control checksum)")


def _check_garbage_after_the_handshake(matcher, piece):
    """A worker that answered the session, then sent bytes that do not frame: its
    divergence (exit 1), named first: the answer it cut short follows from it."""
    w = _worker()
    r = _run(piece, matcher, live=[*w[:3], bytes(40), *w[3:]])
    assert r.fatal is None and len(r.report.divergences) == 2, r.report.lines()
    first, second = r.report.divergences
    assert first.where == "connection" and first.what == (
        "the live worker's stream does not decode after 3 frames: bad_magic: magic "
        "b'\\x00\\x00\\x00\\x00'")
    assert second.key == (0, 1, 1) and second.what == "live sent 1 of the 6 frames captured"


def _check_a_bad_live_checksum(matcher, piece):
    """A payload that fails its checksum decodes (the frame is framed): the step
    diverges on it. A header that fails its checksum breaks the stream."""
    w = _worker()
    payload = bytearray(w[1])
    payload[-1] ^= 0x40  # the last q byte
    r = _run(piece, matcher, live=[w[0], bytes(payload), *w[2:]])
    assert [d.describe() for d in r.report.divergences] == [
        "c1 s0 g1 r1 frame 1: the live REPLY #1's payload fails its check "
        "(checksum_mismatch)"]
    head = bytearray(w[1])
    head[33] ^= 0x01  # a control byte: the header's checksum covers it
    r = _run(piece, matcher, live=[w[0], bytes(head), *w[2:]])
    assert r.report.divergences[0].what.startswith(
        "the live worker's stream does not decode after 1 frames: checksum_mismatch")


# -- 4. other session limits ----------------------------------------------------------------


def _check_other_limits_diverge_by_name(matcher, piece):
    """The HELLO_ANSWER's limits are an answer like the rest (see docs/capture.md): a
    divergence naming each limit that differs; every step is still compared."""
    w = _worker()
    hello = _decoded(w[0])
    narrower = msgspec.structs.replace(hello.limits, max_support=8, sparse_row_bytes=64)
    r = _run(piece, matcher, live=[encode(msgspec.structs.replace(hello, limits=narrower)),
                                   *w[1:]])
    assert [(d.where, d.what) for d in r.report.divergences] == [
        ("handshake", "HELLO_ANSWER limits: max_support captured 16, live 8; "
                      "sparse_row_bytes captured 128, live 64")]
    assert _steps(r.report) == {"matched": 6, "diverged": 1}  # the handshake


# -- 5. a frame the network copied ----------------------------------------------------------


def _check_a_network_copy_is_not_compared(matcher, piece):
    """A REPLY and a COMPLETION delivered twice to the capturing verifier: counted, not
    compared. The same copy sent by the live worker is its own: a divergence."""
    header, recs = _capture()
    w = _worker()
    after = [sum(map(len, w[:k + 1])) for k in range(len(w))]
    copied = spliced(header.role, recs, 1, Flow.TO_VERIFIER, after[7], w[7],
                     joins="previous")
    copied = spliced(header.role, copied, 1, Flow.TO_VERIFIER, after[1], w[1],
                     joins="previous")
    r = _run(piece, matcher, recs=copied, live=w)
    assert r.report.ok and r.report.copies == 2, r.report.lines()
    assert _steps(r.report) == {"matched": 6}
    r = _run(piece, matcher, live=[*w[:2], w[1], *w[2:]])
    assert [d.describe() for d in r.report.divergences][:1] == [
        "c1 s0 g1 r1 frame 2 position 5: captured position 5, live 4"]


def _check_a_repeat_is_a_copy_only_in_a_verifiers_capture(matcher, piece):
    """The same REPLY recorded twice in a row, in each side's capture of the session. The
    verifier's recorded it after the network: a copy, counted and not compared (a live
    worker sending it once matches). The worker's recorded what the worker sent, no
    network between: it sent it twice, and that is compared (a live worker sending it
    once diverges there; one sending it twice, as captured, matches)."""
    header, recs = _capture()
    w = _worker()
    for role in Role:
        copied = spliced(role, recorded_by(role, header.role, recs), 1, Flow.TO_VERIFIER,
                         len(w[0]) + len(w[1]), w[1], joins="previous")
        r = _run(piece, matcher, recs=copied, role=role, live=w)
        if role is Role.VERIFIER:
            assert r.report.ok and r.report.copies == 1, r.report.lines()
            assert _steps(r.report) == {"matched": 6}
            continue
        assert r.report.copies == 0
        assert [d.describe() for d in r.report.divergences] == [
            "c1 s0 g1 r1 frame 2 position 4: captured position 4, live 5"]
        r = _run(piece, matcher, recs=copied, role=role)
        assert r.report.ok and r.report.copies == 0, r.report.lines()
        assert _steps(r.report) == {"matched": 6}


# -- each check: as it stands, and against its planted fault ------------------------------


class ClosesQuietly(AnswerMatcher):
    """Ignores the worker's close (what the replay does once the socket ends)."""

    def worker_closed(self, conn, before=None):
        return None


class EveryCloseFatal(AnswerMatcher):
    """Any close is exit 3, answer due or not."""

    def worker_closed(self, conn, before=None):
        return super().worker_closed(conn, before) or "closed the connection"


class ForgetsDivergences(AnswerMatcher):
    def diverged(self, conn):
        return False


class OneWording(AnswerMatcher):
    """Calls every session refusal a refusal of the HELLO."""

    def fatal(self, conn):
        why = super().fatal(conn)
        return why and why.replace("ended the session", "refused the session")


class IgnoresBrokenCapture(AnswerMatcher):
    def capture_broken(self, what):
        pass


class UndecodableIsAlwaysADivergence(AnswerMatcher):
    def undecodable(self, conn, error, frames):
        super().undecodable(conn, error, max(frames, 1))


class IgnoresUndecodable(AnswerMatcher):
    def undecodable(self, conn, error, frames):
        pass


class CopiesInEveryCapture(AnswerMatcher):
    """Takes a repeat for the network's copy whoever took the capture."""

    def __init__(self, report=None, *, network_copies=True):
        super().__init__(report, network_copies=True)


class _ComparesCopies(StepMatch):
    def add_captured(self, a):
        self._last_captured = None
        super().add_captured(a)


def _plant(monkeypatch, module, name, value):
    monkeypatch.setattr(module, name, value)
    return AnswerMatcher


def _positional_plain(value):  # structs by position, as msgspec.to_builtins gives them
    value = msgspec.to_builtins(value)
    return tuple(value) if isinstance(value, list) else value


def _answer_without_error(frame):  # a frame whose payload failed, summarised as sound
    return dataclasses.replace(answers.answer_of(frame), error=None)


CHECKS = {  # check -> its planted fault: (monkeypatch) -> the matcher to run it with
    _check_close_with_an_answer_due: lambda mp: ClosesQuietly,
    _check_close_with_no_answer_due: lambda mp: EveryCloseFatal,
    _check_close_after_a_divergence: lambda mp: ForgetsDivergences,
    _check_a_session_refusal_is_named_refused_or_ended: lambda mp: OneWording,
    _check_a_captured_stream_that_stops_decoding: lambda mp: IgnoresBrokenCapture,
    _check_a_capture_file_cut_part_way: lambda mp: IgnoresBrokenCapture,
    _check_not_the_wire: lambda mp: UndecodableIsAlwaysADivergence,
    _check_garbage_after_the_handshake: lambda mp: IgnoresUndecodable,
    _check_a_bad_live_checksum: lambda mp: _plant(mp, live_stream, "answer_of",
                                                  _answer_without_error),
    _check_other_limits_diverge_by_name: lambda mp: _plant(mp, answers, "_plain",
                                                           _positional_plain),
    _check_a_network_copy_is_not_compared: lambda mp: _plant(mp, answer_matcher, "StepMatch",
                                                             _ComparesCopies),
    _check_a_repeat_is_a_copy_only_in_a_verifiers_capture: lambda mp: CopiesInEveryCapture,
}


def _call(check, matcher, piece, tmp_path):
    if check is _check_a_capture_file_cut_part_way:
        return check(matcher, piece, tmp_path)
    return check(matcher, piece)


@pytest.mark.parametrize("piece", PIECES, ids=["frames", "bytes"])
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__[len("_check_"):])
def test_the_replay_ends_as_documented(check, piece, tmp_path):
    _call(check, AnswerMatcher, piece, tmp_path)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__[len("_check_"):])
def test_each_check_fails_on_its_planted_fault(check, monkeypatch, tmp_path):
    matcher = CHECKS[check](monkeypatch)
    with pytest.raises(AssertionError):
        _call(check, matcher, None, tmp_path)
