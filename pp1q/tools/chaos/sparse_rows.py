"""The chaos matrix's sparse rows: frame faults on the PROPOSAL (wire revision 3).

A sampled sparse step whose rows fit one frame (``sizes.proposal_fits``) is answered by
one PROPOSAL, which carries every position and plays the COMPLETION. These rows run on
their own pair: vocabulary 256 and ``--top-k 32``, every request asking top_k 32, so a
round is one STEP and one PROPOSAL of 5 x 32 x 8 = 1280 payload bytes (a vocab-256
session allows a frame 2048; at the dense rows' vocabulary 16 no top-32 support exists
and a top-3 row is the largest that fits). Every row checks, beside the matrix's common
checks (``matrix.run_case``), that every COMMIT the audit saw named a proposal that came
as one PROPOSAL frame. What each fault must end in, read from
pp1q/wire/verifier_endpoint.py and pp1q/wire/decoder.py (and shown at the endpoint in
tests/tools/test_chaos_proposal.py):

- drop: the step's only frame never comes; the STEP watchdog fails it
  (``watchdog_timeouts`` = ``fallbacks{watchdog_timeout}`` = injections), nothing late;
- bit flip in the payload: the frame's payload checksum fails, frame-aligned
  (``validation_failures{checksum_mismatch}`` = ``fallbacks{invalid_reply}``);
- truncate (payload cut to 4 bytes, header consistent): ``proposal_sizes`` refuses the
  declared length before the payload is read (``validation_failures{unexpected_size}``);
- duplicate: the copy reaches the verifier after the original made the slot READY and
  is discarded unread (``late_replies_discarded{duplicate_round}`` = injections, none
  for another reason, no fallback at all, no validation failure): the original
  proposal stands;
- stale replay: a copy delivered once its generation is dead, discarded
  (``late_replies_discarded{stale_generation}`` = injections, none for another
  reason, no fallback);
- delay past the watchdog: the watchdog fails the step, the late frame is discarded
  (``watchdog_timeouts`` = ``late_replies_discarded{stale_generation}`` = injections);
- disconnect mid-PROPOSAL: half the frame written, then RST (``reconnects``).

Reorder has no sparse row: a PROPOSAL is its step's only frame, so the next frame of its
slot comes only after the watchdog failed the step (a delay by another name), and
whether it comes at all depends on the slot being used again.
"""

from __future__ import annotations

from pathlib import Path

from pp1q.tools.chaos.faults import (
    BitFlip,
    Delay,
    Disconnect,
    Drop,
    Duplicate,
    FaultKind,
    Replay,
    Truncate,
)
from pp1q.tools.chaos.matrix import (
    WATCHDOG_MS,
    Case,
    Deltas,
    equal,
    late,
    lost,
    planned_rule,
    reason_row,
)
from pp1q.tools.chaos.rig import Rig
from pp1q.wire import MsgType

SPARSE_VOCAB = 256  # a top-32 depth-5 PROPOSAL (1280 bytes) needs V >= 160: a session's
# frame bound is max(4 V, 8 min(V, 256)) bytes (sizes.proposal_fits)
SPARSE_TOP_K = 32
PROPOSAL = MsgType.PROPOSAL


def sparse_rig(log_dir: str | Path) -> Rig:
    return Rig(log_dir, vocab=SPARSE_VOCAB, preset="far", watchdog_ms=WATCHDOG_MS,
               top_k=SPARSE_TOP_K)


def _watchdog(late_frames: int | None):
    """Every injection cost one STEP watchdog and nothing else; ``late_frames``: frames
    that must have arrived after it and been discarded, as stale_generation (the
    watchdog invalidated their generation; None: as many as injections)."""
    def expect(d: Deltas, n: int) -> list[str]:
        return (equal("watchdog_timeouts", d("watchdog_timeouts_total"), n)
                + equal("fallbacks{watchdog_timeout}",
                        d("fallbacks_total", cause="watchdog_timeout"), n)
                + equal("fallbacks (all causes)", sum(d.fallbacks().values()), n)
                + late("stale_generation", late_frames)(d, n)
                + equal("reconnects", d("reconnects_total"), 0))
    return expect


def _discarded(reason: str):
    """The copies were discarded unread, each for ``reason``; the originals were
    verified."""
    def expect(d: Deltas, n: int) -> list[str]:
        return (late(reason)(d, n)
                + equal("fallbacks (all causes)", sum(d.fallbacks().values()), 0)
                + equal("validation_failures{duplicate_round}",
                        d("validation_failures_total", reason="duplicate_round"), 0)
                + equal("reconnects", d("reconnects_total"), 0))
    return expect


def sparse_cases(watchdog_s: float) -> list[Case]:
    def case(name, kind, counter, fault, expect, **kw) -> Case:
        return Case(f"sparse: {name}", kind, counter, planned_rule(fault, PROPOSAL, None),
                    expect, top_k=SPARSE_TOP_K, proposals=True, **kw)

    return [
        case("drop", FaultKind.DROP, "watchdog_timeouts", Drop(), _watchdog(late_frames=0)),
        case("bit flip", FaultKind.BIT_FLIP, "validation_failures{checksum_mismatch}",
             BitFlip("payload", offset=5, bit=3), reason_row("checksum_mismatch")),
        case("truncate", FaultKind.TRUNCATE, "validation_failures{unexpected_size}",
             Truncate(keep=4), reason_row("unexpected_size")),
        case("duplicate frame", FaultKind.DUPLICATE, "late_replies_discarded{duplicate_round}",
             Duplicate(), _discarded("duplicate_round")),
        case("stale-generation replay", FaultKind.REPLAY,
             "late_replies_discarded{stale_generation}", Replay(),
             _discarded("stale_generation")),
        case("delay past watchdog", FaultKind.DELAY, "watchdog_timeouts",
             Delay(3 * watchdog_s), _watchdog(late_frames=None)),
        case("disconnect mid-proposal", FaultKind.DISCONNECT, "reconnects", Disconnect(), lost,
             lossless=False),
    ]
