"""Rank votes: how every rank votes on an exchange's ops and derives the same verdicts.

Each rank fills only its own row of a ``(world, 1 + ops, VOTE_WORDS)`` int64 array: row
0 its presence (the exchange sequence and its rank: proof it is at this exchange), then
one vote per op (``yes`` with the op decider's decision, or ``no`` with a Reason).
The rows are summed across ranks (pp1q.verifier.ranks.collective), so the sum holds
every rank's row, and ``verdicts`` turns it into the same verdicts on every rank: an
op commits when every rank voted yes and its decider's decision passes the same
checks, otherwise every rank discards it. The ops themselves: pp1q.verifier.ranks.ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pp1q.core.errors import Reason, RemoteProtocolError
from pp1q.verifier.ranks.ops import REASONS, Limits, Op, OpKind

VOTE_WORDS = 6  # vote, reason, accepted, token, committed length, committed digest
YES, NO = 1, 2  # vote words; 0 means a rank did not vote (desynchronised: never a yes)


@dataclass(frozen=True)
class Verdict:
    """What every rank does with one op: commit (``ok``) or discard, and why not."""

    ok: bool
    accepted: int = 0
    token: int = 0
    length: int = 0  # committed prefix length after the op (ROUND / TARGET_ONLY)
    digest: int = 0  # and its digest, as the decider computed it
    reason: Reason | None = None
    rank: int | None = None  # the first rank that refused


def yes(accepted: int = 0, token: int = 0, length: int = 0, digest: int = 0) -> np.ndarray:
    return np.array([YES, 0, accepted, token, length, _i64(digest)], dtype=np.int64)


def no(reason: Reason) -> np.ndarray:
    return np.array([NO, REASONS.index(Reason(reason)) + 1, 0, 0, 0, 0], dtype=np.int64)


def presence(seq: int, rank: int) -> np.ndarray:
    """Row 0 of every rank's votes: proves it is at the same exchange."""
    return np.array([_i64(seq), rank + 1, 0, 0, 0, 0], dtype=np.int64)


def _i64(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


def _u64(i: int) -> int:
    return i + (1 << 64) if i < 0 else i


def verdicts(ops: list[Op], votes: np.ndarray, seq: int, limits: Limits) -> list[Verdict]:
    """``votes[rank, 0]``: presence rows; ``votes[rank, 1 + i]``: each rank's vote on op i.
    Raises RemoteProtocolError when a rank is not at this exchange (the group is lost)."""
    if votes.shape != (limits.world, 1 + len(ops), VOTE_WORDS):
        raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, f"votes of shape {votes.shape}")
    for r in range(limits.world):
        if not np.array_equal(votes[r, 0], presence(seq, r)):
            raise RemoteProtocolError(Reason.OUT_OF_ORDER, f"rank {r} is not at exchange {seq}")
    out = []
    for i, op in enumerate(ops):
        rows = votes[:, 1 + i]
        refusing = [r for r in range(limits.world) if rows[r, 0] != YES]
        if refusing:
            r = refusing[0]
            code = int(rows[r, 1])
            why = REASONS[code - 1] if rows[r, 0] == NO and 1 <= code <= len(REASONS) \
                else Reason.OUT_OF_ORDER
            out.append(Verdict(False, reason=why, rank=r))
            continue
        d = rows[op.decider]
        out.append(_checked(op, int(d[2]), int(d[3]), int(d[4]), _u64(int(d[5])), limits))
    return out


def _checked(op: Op, accepted: int, token: int, length: int, digest: int,
             limits: Limits) -> Verdict:
    """The decider's decision, checked by every rank the same way before anyone commits."""
    if op.kind is OpKind.ROUND:
        drafts = int(np.asarray(op.drafts).size)
        fine = 0 <= accepted <= drafts and length == op.prefix_len + accepted + 1
    elif op.kind is OpKind.TARGET_ONLY:
        fine = accepted == 0 and length == op.prefix_len + 1
    else:
        return Verdict(True)
    if not fine:
        return Verdict(False, reason=Reason.BAD_POSITION, rank=op.decider)
    if not 0 <= token < limits.vocab:
        return Verdict(False, reason=Reason.ID_OUT_OF_RANGE, rank=op.decider)
    return Verdict(True, accepted, token, length, digest)
