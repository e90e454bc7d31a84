"""The live replay's sans-IO core: worker frames summarised (``answers``), one step's
captured and live answers compared (``step_match``), a connection's steps and what the
replay still waits for (``answer_matcher``). Frames come from the checked-in captures."""

import capture_vectors
import msgspec
import numpy as np
import pytest
from capture_edits import rechunk
from live_replay import self_replay

from pp1q.core.errors import Reason
from pp1q.runtime.capture import read_capture
from pp1q.tools.replay import decode
from pp1q.tools.replay.answer_matcher import AnswerMatcher
from pp1q.tools.replay.answers import HANDSHAKE, answer_of, difference
from pp1q.tools.replay.step_match import MAX_AHEAD, Outcome, StepMatch
from pp1q.tools.replay.streams import Flow
from pp1q.wire import FrameDecoder, HelloAnswer, Reply, Reset, Step, encode

DATA = capture_vectors.DATA_DIR


def _worker_frames(name="clean_v2"):
    header, recs = read_capture(DATA / f"{name}.pp1qcap")
    return [i.frame for i in decode(header.role, recs)
            if i.what == "frame" and i.flow is Flow.TO_VERIFIER]


def _step_answer(name="clean_v2", slot=0):
    """The frames of the first answered STEP of ``slot``: (key, [Answer])."""
    answers = [answer_of(f) for f in _worker_frames(name)]
    key = next(a.key for a in answers if a.key is not HANDSHAKE and a.key[0] == slot)
    return key, [a for a in answers if a.key == key]


def _decoder(name="clean_v2"):
    """A decoder with the capture's session limits (a dense row is its vocabulary long)."""
    header, recs = read_capture(DATA / f"{name}.pp1qcap")
    answer = next(i.message for i in decode(header.role, recs)
                  if isinstance(i.message, HelloAnswer))
    return FrameDecoder(answer.limits)


def _reframed(frame, **changes):
    """The frame's message with ``changes``, encoded and decoded again (a valid frame)."""
    msg = msgspec.structs.replace(frame.message, **changes)
    [out] = _decoder().feed_frames(encode(msg))
    assert out.error is None
    return out


def _first_reply(name="clean_v2"):
    return next(f for f in _worker_frames(name)
                if isinstance(f.message, Reply) and f.message.q is not None)


def test_the_same_frame_summarises_equal_and_small():
    frames = _worker_frames()
    again = _worker_frames()
    assert frames and all(answer_of(a) == answer_of(b) for a, b in zip(frames, again, strict=True))
    a = answer_of(_first_reply())
    assert a.kind == "REPLY" and a.rows[0].digest is not None and a.rows[0].q_count > 0
    assert not any(isinstance(v, np.ndarray) for _, v in a.fields)  # no rows kept


def test_a_different_token_is_named_with_its_position():
    f = _first_reply()
    live = _reframed(f, token=(f.message.token + 1) % 64)
    position, what = difference(answer_of(f), answer_of(live))
    assert position == f.message.position
    assert what == f"token: captured {f.message.token}, live {(f.message.token + 1) % 64}"


def test_a_different_q_row_is_named_with_both_qs():
    f = _first_reply()
    q = np.array(f.message.q, dtype=np.float32)
    t = f.message.token
    other = (t + 1) % len(q) if f.message.ids is None else 0
    at = t if f.message.ids is None else int(np.searchsorted(f.message.ids, t))
    moved = q[at] / 2  # half the token's mass to another entry: still a valid row
    q[at] -= moved
    q[other if f.message.ids is None else (at + 1) % len(q)] += moved
    position, what = difference(answer_of(f), answer_of(_reframed(f, q=q)))
    assert position == f.message.position and what.startswith(f"q row (token {t}): captured q=")
    assert "/2^24, live q=" in what


def test_a_corrupt_captured_payload_is_named():
    f = _first_reply()
    raw = bytearray(encode(f.message))
    raw[-1] ^= 0x40  # the last q byte; the header's checksum now disagrees
    [bad] = _decoder().feed_frames(bytes(raw))
    assert bad.error is not None
    _, what = difference(answer_of(bad), answer_of(f))
    assert what == f"the captured REPLY #{f.message.index}'s payload fails its check " \
                   "(checksum_mismatch)"


def test_a_payload_corrupted_on_the_way_is_checked_by_its_claimed_checksum():
    """In a capture made after a network (a verifier's), a captured payload that fails
    its checksum was corrupted on the way (a chaos bit flip): the live frame is compared
    by all the rest, its payload by the checksum the captured header claims (the
    worker's own, intact), and counted. In a worker's capture, or with a live payload
    that differs, it is still a divergence."""
    f = _first_reply()
    raw = bytearray(encode(f.message))
    raw[-1] ^= 0x40  # the last q byte; the header's checksum now disagrees
    [bad] = _decoder().feed_frames(bytes(raw))
    captured, live = answer_of(bad), answer_of(f)
    assert difference(captured, live, network=True) is None
    assert difference(captured, live)[1].endswith("payload fails its check (checksum_mismatch)")
    q = f.message.q.copy()
    t = f.message.token
    at = t if f.message.ids is None else int(np.searchsorted(f.message.ids, t))
    other = (at + 1) % len(q)
    q[at], q[other] = q[at] - q[at] / 2, q[other] + q[at] / 2  # another valid row
    _, what = difference(captured, answer_of(_reframed(f, q=q)), network=True)
    assert what.startswith(f"REPLY #{f.message.index} payload checksum: captured ")
    _, what = difference(captured, answer_of(_reframed(f, token=(t + 1) % 64)), network=True)
    assert what.startswith("token: captured ")
    assert difference(live, captured, network=True) is not None  # a live payload that fails
    for network in (True, False):  # a step's first frame, through the step's comparison
        s = StepMatch(1, (0, 1, 1), network_copies=network)
        s.add_captured(captured)
        s.add_live(live)
        assert (s.divergence is None, s.corrupted) == (network, int(network))


def test_other_session_limits_are_named_limit_by_limit():
    """Limits travel by position (array-like): a divergence names each member that
    differs, not two unnamed tuples."""
    hello = next(f for f in _worker_frames() if isinstance(f.message, HelloAnswer))
    narrower = msgspec.structs.replace(hello.message.limits, max_support=8,
                                       sparse_row_bytes=64)
    _, what = difference(answer_of(hello), answer_of(_reframed(hello, limits=narrower)))
    assert what == ("HELLO_ANSWER limits: max_support captured 16, live 8; "
                    "sparse_row_bytes captured 128, live 64")


def _sent_step():
    """A STEP sent to the worker, its captured answer not yet added."""
    key, answer = _step_answer()
    s = StepMatch(1, key)
    s.sent = True
    return s, answer


def test_a_step_matches_frame_by_frame_and_lets_compared_frames_go():
    s, answer = _sent_step()
    for a in answer:
        s.add_captured(a)
        assert s.owed
        assert s.add_live(a)
        assert s.held == 0  # compared and let go
    assert not s.owed and s.finish() is Outcome.MATCHED


def test_a_live_frame_after_the_end_diverges():
    s, answer = _sent_step()
    for a in answer:
        s.add_captured(a)
        s.add_live(a)
    s.add_live(answer[0])
    assert s.finish() is Outcome.DIVERGED and "after the captured answer's end" in s.divergence.what


def test_a_reset_answer_is_compared_as_far_as_both_went():
    s, answer = _sent_step()
    for a in answer[:3]:
        s.add_captured(a)
    s.add_live(answer[0])
    s.reset = True  # the verifier gave up on it: the worker stops wherever it read that
    assert not s.owed and s.finish() is Outcome.PARTIAL


def test_a_short_live_answer_diverges_without_a_reset():
    s, answer = _sent_step()
    for a in answer:
        s.add_captured(a)
    s.add_live(answer[0])
    assert s.finish() is Outcome.DIVERGED
    assert s.divergence.what == f"live sent 1 of the {len(answer)} frames captured"


def test_a_network_copy_in_the_capture_is_counted_not_compared():
    """Every captured frame twice, as a chaos proxy's duplicates reach the verifier: the
    copies are counted, the answer matches. The live worker sending one twice is its own
    doing (it is read directly): a divergence."""
    key, answer = _step_answer()
    m = _matcher_sent(key)
    for a in answer:
        m.captured(1, a)
        m.captured(1, a)
        m.live(1, a)
    m.close(1)
    assert m.report.ok and m.report.outcomes[Outcome.MATCHED] == 1
    assert m.report.copies == len(answer)
    assert m.report.summary().endswith(f"; {len(answer)} captured frames were network "
                                       "copies, not compared")
    s, answer = _sent_step()
    for a in answer:
        s.add_captured(a)
    s.add_live(answer[0])
    s.add_live(answer[0])
    assert s.finish() is Outcome.DIVERGED and s.copies == 0


def test_a_repeat_in_a_capture_without_a_network_is_compared():
    """Without ``network_copies`` (a worker's capture: its frames recorded as it sent
    them) a REPLY captured twice is the worker's own repeat: compared, it matches a live
    worker that repeats it too and diverges from one that does not; nothing is counted."""
    key, [first, *rest] = _step_answer()
    assert first.kind == "REPLY"
    for live, outcome in (([first, first, *rest], Outcome.MATCHED),
                          ([first, *rest], Outcome.DIVERGED)):
        m = _matcher_sent(key, network_copies=False)
        for a in [first, first, *rest]:
            m.captured(1, a)
        for a in live:
            m.live(1, a)
        m.close(1)
        assert dict(m.report.outcomes) == {outcome: 1} and m.report.copies == 0


def test_a_worker_far_ahead_of_the_capture_stops_being_read():
    s, answer = _sent_step()
    kept = [s.add_live(answer[0]) for _ in range(MAX_AHEAD)]
    assert all(kept[:-1]) and not kept[-1]
    assert s.finish() is Outcome.DIVERGED and s.held == 0


def _step_msg(key, **kw):
    slot, generation, round_id = key
    fields = dict(session=1, slot=slot, generation=generation, round_id=round_id,
                  last_committed=2, first_position=3, prefix_digest=0, depth=5,
                  temperature=1.0, top_k=0, context_version=0, seed=7)
    return Step(**{**fields, **kw})


def _matcher_sent(key, **kw) -> AnswerMatcher:
    """A matcher (``kw``: its options) with connection 1 open and ``key``'s STEP sent."""
    m = AnswerMatcher(**kw)
    m.open(1)
    m.sent(1, _step_msg(key))
    return m


def test_the_matcher_owes_what_the_capture_showed_and_reports_per_slot():
    key, answer = _step_answer()
    m = _matcher_sent(key)
    for a in answer:
        m.captured(1, a)
    assert m.owed(1) == [key]
    f = _first_reply()
    wrong = answer_of(_reframed(f, token=(f.message.token + 1) % 64))
    assert m.live(1, wrong) and m.diverged(1)
    assert m.owed(1) == [key]  # a diverged answer is still waited for: COMMIT comes after it
    for a in answer[1:]:
        m.live(1, a)
    assert m.owed(1) == []
    m.sent(1, Reset(session=1, slot=key[0], generation=key[1], reason=Reason.CANCELLED))
    m.close(1)
    r = m.report
    assert not r.ok and r.outcomes[Outcome.DIVERGED] == 1 and r.steps == 1
    [first] = r.first_per_slot()
    assert first.key == key and first.frame == 1 and "token: captured" in first.what
    assert r.lines()[0].startswith(f"!! DIVERGENCE   slot {key[0]}: c1 s{key[0]} g{key[1]} "
                                   f"r{key[2]} frame 1 position ")


def test_a_frame_for_a_step_never_sent_is_not_kept():
    key, answer = _step_answer()
    m = AnswerMatcher()
    m.open(1)
    assert not m.live(1, answer[0])  # stop reading: nothing to compare it with
    m.close(1)
    assert [d.where for d in m.report.divergences] == ["connection"]
    assert "a step the replay never sent" in m.report.divergences[0].what


class _CountsOpenSteps(AnswerMatcher):
    """The most steps one connection held at once (after each frame the replay sent)."""

    most = 0

    def sent(self, conn, msg):
        super().sent(conn, msg)
        type(self).most = max(type(self).most, len(self._steps[conn]))


@pytest.mark.parametrize("piece", [None, 1], ids=["frames", "bytes"])
@pytest.mark.parametrize("name", capture_vectors.NAMES)
def test_a_capture_against_itself_matches_every_step(name, piece):
    """Every checked-in capture against a live worker sending its captured worker's bytes
    (tests/support/live_replay.py, the live stream read a frame or a byte at a time): all
    its answers match, and a connection holds its slots' open steps, not its history."""
    header, recs = read_capture(DATA / f"{name}.pp1qcap")
    slots = {i.message.slot for i in decode(header.role, recs) if isinstance(i.message, Step)}
    _CountsOpenSteps.most = 0
    r = self_replay(header.role, rechunk(recs, piece) if piece else recs, piece=piece,
                    matcher=_CountsOpenSteps)
    assert r.fatal is None and r.report.ok, r.report.lines()
    assert r.report.outcomes[Outcome.MATCHED] > len(slots)
    assert _CountsOpenSteps.most <= len(slots) + 1  # open steps and the handshake


def _reply(key, index, token=None):
    """A REPLY's summary (the fields the matcher reads), ``token`` its sampled one."""
    from pp1q.tools.replay.answers import Answer, Row

    token = index if token is None else token
    return Answer("REPLY", key, (("index", index),), token, None, (Row(index, token, None, None),))


def test_reset_steps_cut_unevenly_are_let_go_once_both_sides_moved_on():
    """Every generation of a slot RESET mid-answer, the captured worker one frame further
    than the live one (when each read the RESET is timing): each step is let go once
    both sides sent a frame of a later generation, so one slot holds two steps, not its
    history (it held every one: 200 here, each with its unmatched frame). A frame of a
    reset step that comes before that is still compared."""
    from wire_helpers import SESSION, step

    m, most = AnswerMatcher(), 0
    m.open(1)
    for g in range(1, 201):
        m.sent(1, step(slot=0, generation=g, round_id=1))
        key = (0, g, 1)
        m.captured(1, _reply(key, 1))
        m.captured(1, _reply(key, 2))
        m.live(1, _reply(key, 1))
        m.sent(1, Reset(session=SESSION, slot=0, generation=g, reason=Reason.CANCELLED))
        most = max(most, len(m._steps[1]))
    m.close(1)
    assert most <= 3  # the handshake, g and g - 1
    assert dict(m.report.outcomes) == {Outcome.PARTIAL: 200}

    m = AnswerMatcher()
    m.open(1)
    m.sent(1, step(slot=0, generation=1, round_id=1))
    m.captured(1, _reply((0, 1, 1), 1))
    m.captured(1, _reply((0, 1, 1), 2))
    m.live(1, _reply((0, 1, 1), 1))
    m.sent(1, Reset(session=SESSION, slot=0, generation=1, reason=Reason.CANCELLED))
    m.sent(1, step(slot=0, generation=2, round_id=1))
    m.live(1, _reply((0, 1, 1), 2, token=9))  # in flight when the next STEP went
    m.close(1)
    assert [d.key for d in m.report.divergences] == [(0, 1, 1)]
