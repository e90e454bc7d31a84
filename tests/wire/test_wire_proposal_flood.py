"""A worker that floods the verifier with PROPOSALs it may not consume (replays of a round
already handed out, copies of a generation the verifier reset) pays for each with a
count and nothing more: every copy is discarded unread under its own reason, the
verifier keeps no memory for any of them, and the honest proposal of the live step is
still taken. (The bounds on what one frame may declare: test_fuzz_bounds.py.)"""

from __future__ import annotations

import collections
import tracemalloc

import pytest
from forked import assert_alone, forked
from wire_helpers import SESSION, feed_buffered, step, stepped, worker_proposal

from pp1q.core.errors import Reason
from pp1q.wire import Discarded, MsgType, ProposalReady, Reset, VerifierEndpoint
from pp1q.wire.sizes import proposal_fits

pytestmark = pytest.mark.experiment  # many-frame floods in process

LIVE = step(top_k=2, depth=5)  # five rows of two entries: the vectors' 80-byte cap exactly
COPIES = 6000  # per reason: 12,000 frames of 177 bytes, 2.1 MB a verifier must not keep
BATCH = 200  # frames a read: a socket read of ~35 KB
# Retained after the flood, beyond what the first batch left: a flood keeps nothing, so
# any growth is the interpreter's own (a dict resize, say). 12,000 kept payloads of 80
# bytes would hold ~1 MB or more.
RETAINED_BYTES = 16 * 1024
# Peak while a batch is read: its events and one frame's copied-out payload at a time,
# not the batch's payloads (and never the flood's).
PEAK_BYTES = 256 * 1024

FEEDS = {
    "whole": lambda v, data: v.receive_data(data, 0.0),
    "buffered": lambda v, data: feed_buffered(v, data, 0.0),
}


def _flood(v: VerifierEndpoint, feed, batches: list[bytes]) -> tuple[collections.Counter, int, int]:
    """(reasons of the Discarded events, bytes retained, peak bytes) of feeding ``batches``,
    measured from after the first batch (warm: a first copy-out, the events' type).
    tracemalloc counts every thread's allocations: the tests run this in a forked child
    (tests/support/forked.py), as its only thread."""
    seen = collections.Counter()

    def take(data: bytes) -> None:
        for e in feed(v, data):
            assert isinstance(e, Discarded) and e.msg_type is MsgType.PROPOSAL, e
            seen[e.reason] += 1

    take(batches[0])
    assert_alone()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for data in batches[1:]:
            take(data)
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return seen, now - base, peak - base


class _Hoarder(VerifierEndpoint):
    """A planted bug: a verifier that keeps every frame it discards (a replay cache grown
    without bound, say). The flood test must see its memory grow."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.kept = []

    def _discard_or_raise(self, frame, s, t, events) -> None:
        super()._discard_or_raise(frame, s, t, events)
        self.kept.append(frame)


def _flooded(feed, cls=VerifierEndpoint):
    """Flood a verifier (``cls``) with replays of a handed-out round, then, after a RESET
    and the next generation's STEP, with copies of the dead generation's proposal; the
    live step's honest proposal last. Returns what ``_flood`` measured for each part,
    the final events and the verifier."""
    v, w = stepped(LIVE, verifier=cls)
    assert proposal_fits(LIVE, v.limits)
    first = worker_proposal(w, LIVE)
    [ready] = feed(v, first)
    assert isinstance(ready, ProposalReady)
    duplicate = _flood(v, feed, [first * BATCH] * (COPIES // BATCH))

    # not CANCELLED (a request's end, which drops the worker's prefix): a discarded one
    w.receive_data(v.send(Reset(session=SESSION, slot=0, generation=1,
                                reason=Reason.STEP_TIMEOUT)), 0.0)
    nxt = step(generation=2, top_k=2, depth=5)
    w.receive_data(v.send(nxt, now=0.0), 0.0)
    honest = worker_proposal(w, nxt)
    stale = _flood(v, feed, [first * BATCH] * (COPIES // BATCH))
    return duplicate, stale, feed(v, honest), v


@pytest.mark.parametrize("feed", FEEDS, ids=list(FEEDS))
@forked
def test_a_proposal_flood_is_counted_and_leaves_nothing_behind(feed):
    duplicate, stale, last, v = _flooded(FEEDS[feed])
    for (seen, retained, peak), reason in ((duplicate, Reason.DUPLICATE_ROUND),
                                           (stale, Reason.STALE_GENERATION)):
        assert seen == {reason: COPIES}  # each copy discarded under its own reason
        assert retained < RETAINED_BYTES, (reason, retained)
        assert peak < PEAK_BYTES, (reason, peak)
    assert v.discarded == {Reason.DUPLICATE_ROUND: COPIES, Reason.STALE_GENERATION: COPIES}
    assert not v.failures  # no live step was failed by the flood
    [ready] = last  # and the live step's honest proposal is taken
    assert isinstance(ready, ProposalReady) and ready.generation == 2


@forked  # measured as the flood test measures
def test_the_flood_test_sees_a_verifier_that_keeps_what_it_discards():
    duplicate, stale, _, v = _flooded(FEEDS["whole"], _Hoarder)
    assert len(v.kept) == 2 * COPIES
    assert duplicate[1] >= RETAINED_BYTES and stale[1] >= RETAINED_BYTES
