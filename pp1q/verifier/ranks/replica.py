"""One verifier rank's replica of the committed state, and the decisions it owns.

Every rank, rank 0 included, holds the same replica: per open slot the request's seed
(each rank derives the verifier's draw seed from it with the group's draw secret, which
rank 0 hands to every rank at join: pp1q.verifier.ranks.launch.share_draw_secret),
greedy flag, committed prefix (with its running digest) and the newest invalidated
generation. ``vote(op)`` checks an op against it (rank 0's prefix length and digest in
the op must equal this rank's: the per-round agreement check) and, on the op's
decider, decides. ``apply(op, verdict)`` commits exactly the verdict every rank derived
from the summed votes, or nothing. Both go through the replica's one decision seam,
``RankDecisions``: ``decide`` (target rows from the committed prefix, then the same
decision as one process, pp1q.verifier.target_rows, with the same keys) and
``committed`` (the tokens a verdict appends). Nothing here blocks on another rank or
knows about torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import LocalProtocolError, Pp1qError, Reason
from pp1q.core.prefix import Prefix
from pp1q.core.q import parse_dense, parse_sparse
from pp1q.core.verify import RoundKeys
from pp1q.models.engine import PREFILL_CHUNK
from pp1q.models.processors import Processors
from pp1q.models.toy import TargetModel
from pp1q.verifier import rounds
from pp1q.verifier.ranks.ops import Form, Limits, Op, OpKind
from pp1q.verifier.ranks.votes import Verdict, no, yes
from pp1q.verifier.target_rows import TargetRows


@dataclass
class SlotReplica:
    seed: int
    greedy: bool
    prefix: Prefix
    invalid_through: int = 0  # no proposal of a generation <= this is verified again
    processors: Processors = Processors()  # the request's target processors (OPEN)
    prefilled: int = 0  # the prompt length its PREFILL ops reached (each must go past it)


def committed_tokens(op: Op, accepted: int, token: int) -> list[int]:
    """What a ROUND or TARGET_ONLY decision appends to the prefix."""
    if op.kind is OpKind.ROUND:
        return [int(t) for t in op.drafts[:accepted]] + [token]
    return [token]


class RankDecisions:
    """A rank's decisions: the op's decider decides, every rank commits the verdict.

    The daemon builds one per rank (pp1q.verifier.daemon.Deciders.rank); a planted-bug
    test passes its own the same way."""

    def __init__(self, target: TargetModel, limits: Limits) -> None:
        self.vocab = limits.vocab
        self.rows = TargetRows(target, limits.slots, limits.depth)
        self.draws: DrawKeys | None = None  # the group's secret, set at join

    def draw_seed(self, s: SlotReplica) -> int:
        if self.draws is None:  # fail closed: never fall back to the STEP's seed
            raise LocalProtocolError(Reason.RNG_KEY_OUT_OF_RANGE, "no draw secret yet")
        return self.draws.seed_for(s.seed)

    def decide(self, op: Op, s: SlotReplica) -> rounds.Outcome:
        """The decision of a ROUND or TARGET_ONLY op after ``s``'s committed prefix."""
        # the request's processors (its OPEN) apply to both kinds through TargetRows, the
        # one function a single process applies them with
        if op.kind is OpKind.TARGET_ONLY:
            return self.rows.target_only(op.slot, s.prefix.tokens, self.draw_seed(s),
                                         op.generation, op.round_id, s.greedy,
                                         processors=s.processors)
        drafts = [int(t) for t in op.drafts]
        q_rows = () if op.greedy else (
            op.q_rows if op.q_rows is not None else self._parse_rows(op))
        keys = RoundKeys(self.draw_seed(s), op.generation, op.round_id, len(s.prefix))
        return self.rows.round(op.slot, s.prefix.tokens, drafts, q_rows, keys, op.greedy,
                               processors=s.processors)

    def prefill(self, op: Op, s: SlotReplica) -> None:
        """A PREFILL op: bring the slot's target cache up to ``s``'s prompt[:op.upto].
        Whole rows on one rank keep no cache (the toy): nothing to do."""

    @property
    def evictions(self) -> int:
        """Slot K/V caches dropped to stay under the memory budget (a metric; only a real
        model's shard keeps any, pp1q.models.hf_shard)."""
        return 0

    def closed(self, slot: int) -> None:
        """``slot``'s request ended (or a new one took it): free what is held for it (a
        real model's per-slot K/V, pp1q.models.hf_shard)."""

    def committed(self, rank: int, op: Op, s: SlotReplica, v: Verdict) -> list[int]:
        """The tokens ``rank`` appends for the verdict every rank derived: the verdict's."""
        return committed_tokens(op, v.accepted, v.token)

    def _parse_rows(self, op: Op) -> list:
        return [parse_sparse(ids, q, self.vocab) if form == Form.SPARSE
                else parse_dense(q, self.vocab) for form, ids, q in op.rows]


class RankState:
    def __init__(self, rank: int, limits: Limits, decisions: RankDecisions,
                 target_delay_s: float = 0.0) -> None:
        self.rank, self.limits, self.decisions = rank, limits, decisions
        self.target_delay_s = target_delay_s
        self.slots: dict[int, SlotReplica] = {}
        self.decided = 0  # decisions this rank made (a metric)
        self.invalidations = 0  # generations invalidated here (a metric)

    # -- voting --------------------------------------------------------------------

    def votes(self, ops: list[Op]) -> list[np.ndarray]:
        """This rank's vote on each op of an exchange, in order."""
        mine = [op for op in ops if op.decider == self.rank
                and op.kind in (OpKind.ROUND, OpKind.TARGET_ONLY)]
        if mine and self.target_delay_s:
            # simulated forward pass (demo): one per exchange, over every row this rank
            # decides, as a batched target forward would be
            time.sleep(self.target_delay_s)
        return [self.vote(op) for op in ops]

    def vote(self, op: Op) -> np.ndarray:
        refusal = self.check(op)
        if refusal is not None:
            return no(refusal)
        if op.kind is OpKind.PREFILL:
            return self.prefill(op)
        if op.decider != self.rank or op.kind not in (OpKind.ROUND, OpKind.TARGET_ONLY):
            return yes()
        try:
            out = self.decisions.decide(op, self.slots[op.slot])
        except Pp1qError as e:  # a row or draft rank 0 should never have passed on
            return no(e.reason)
        self.decided += 1
        return self.yes_with(op, out)

    def prefill(self, op: Op) -> np.ndarray:
        """Every rank runs a PREFILL it accepts (its own cache); a failure is a no."""
        try:
            self.decisions.prefill(op, self.slots[op.slot])
        except Pp1qError as e:
            return no(e.reason)
        return yes()

    def yes_with(self, op: Op, out: rounds.Outcome) -> np.ndarray:
        """A yes carrying decision ``out`` and the committed state it leads to."""
        tokens = committed_tokens(op, out.accepted, out.token)
        after = self.slots[op.slot].prefix.copy()
        after.extend(tokens)
        return yes(out.accepted, out.token, len(after), after.digest)

    def joined(self, coll) -> None:
        """The group formed (``coll``: this rank's Collective); a sharded replica keeps
        it for the collectives of its decisions (pp1q.verifier.ranks.sharded)."""

    def check(self, op: Op) -> Reason | None:
        s = self.slots.get(op.slot)
        if op.kind is OpKind.CLOSE:
            return None  # always: a request may end at any point, even one never opened
        if op.kind is OpKind.OPEN:
            if s is not None:
                return Reason.STATE_NOT_ALLOWED  # a CLOSE was missed: desynchronised
            if Prefix(op.prompt).digest != op.prefix_digest:
                return Reason.CHECKSUM_MISMATCH
            return None
        if s is None:
            return Reason.STATE_NOT_ALLOWED
        if len(s.prefix) != op.prefix_len or s.prefix.digest != op.prefix_digest:
            return Reason.CHECKSUM_MISMATCH  # this rank committed something else
        if op.kind is OpKind.ROUND and op.generation <= s.invalid_through:
            return Reason.STALE_GENERATION
        if op.kind is OpKind.PREFILL and not 0 < op.upto - s.prefilled <= PREFILL_CHUNK:
            return Reason.BAD_POSITION  # backwards, or more than one chunk's forward
        return None

    # -- committing ----------------------------------------------------------------

    def apply(self, op: Op, v: Verdict) -> bool:
        """Commit ``v`` (every rank derived the same one), or nothing when it refuses.
        False when this rank's result differs from the decider's (it then refuses every
        later op of the slot, so the disagreement surfaces at once)."""
        if not v.ok:
            return True
        if op.kind is OpKind.OPEN:
            self.decisions.closed(op.slot)
            self.slots[op.slot] = SlotReplica(op.seed, op.greedy, Prefix(op.prompt),
                                              processors=op.processors)
        elif op.kind is OpKind.CLOSE:
            self.slots.pop(op.slot, None)
            self.decisions.closed(op.slot)
        elif op.kind is OpKind.PREFILL:
            self.slots[op.slot].prefilled = op.upto  # its K/V: the rank's cache, not here
        elif op.kind is OpKind.INVALIDATE:
            s = self.slots[op.slot]
            s.invalid_through = max(s.invalid_through, op.generation)
            self.invalidations += 1
        else:
            s = self.slots[op.slot]
            s.prefix.extend(self.decisions.committed(self.rank, op, s, v))
            prefix = s.prefix
            return len(prefix) == v.length and prefix.digest == v.digest
        return True
