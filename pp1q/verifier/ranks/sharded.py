"""``--shard-vocab``: every rank holds one vocabulary shard and takes part in every decision.

The replicated group (replica.RankDecisions) has one rank decide each op from whole
rows. Here rank r holds the target's LM head rows [lo_r, hi_r) only (shard_target: the
toy's, or a Hugging Face model's, pp1q.models.hf_shard),
and a decision is the exact sampler of pp1q_kernels.shard_step run by every rank
together over the group's collectives (shard_collective.ShardComm): p normalised by
exact integer sums, the ratio test on the draft's owner, the correction, bonus and
target-only picks by one gather of N masses and the owner's pick. The result is
bit-identical to one rank deciding from the whole row (tests/kernels/
test_kernels_shard_step.py, tests/verifier/ranks/test_ranks_shard_gloo.py).

Inside an exchange (collective.Collective.exchange) every rank must enter the same
collectives in the same order, so ``ShardedRankState.votes`` first agrees which ops
every rank accepts (one gather of each rank's check of each op: its replica, the
generation), then decides the accepted ROUND and TARGET_ONLY ops one after another;
an accepted PREFILL (a real model's prompt chunk, pp1q.verifier.ranks.decider) each rank
runs on its own K/V, with no collective.
A refusal inside a decision (q = 0 at a draft, a bad row) is reached by every rank at
the same collective, so every rank votes the same no. A rank that dies or hangs fails
the collective it is in: the group is lost (503 ranks_lost), nothing is committed.

The request's target temperature (in its OPEN op, with its other processors) divides
every shard's logits in float64 before the sampler, the same element-wise x / T that
pp1q.models.processors applies to a whole row, so N ranks still decide exactly as one
rank from the concatenated rows. Its top-k and top-p are pp1q_kernels.shard_processors:
the same rule on the fixed-point rows in exact integers (one gather of each rank's k
largest, or a radix select of top-p's boundary), so every split keeps the same ids, for
a round's rows and a target-only pick alike. A top_k above MAX_SHARD_TOP_K (and below
the vocabulary) is refused: by the HTTP API (422 unsupported_processors, counted) and
by every rank alike, before any collective.

q to ranks: sparse rows are in the op (every rank holds the whole, small row); a dense
row travels as Form.SHARDED: rank 0 scatters each rank its slice of the counts after
the envelope (docs/operations.md, "Vocabulary-sharded ranks", has the bytes).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from pp1q.core.errors import ConfigError, Pp1qError
from pp1q.core.q import parse_sparse
from pp1q.core.verify import RoundKeys, round_draws, target_only_draw
from pp1q.verifier import rounds
from pp1q.verifier.ranks.collective import GroupError
from pp1q.verifier.ranks.ops import REASONS, Form, Limits, Op, OpKind
from pp1q.verifier.ranks.replica import RankDecisions, RankState, SlotReplica
from pp1q.verifier.ranks.shard_collective import ShardComm
from pp1q.verifier.ranks.shard_target import shard_of
from pp1q.verifier.ranks.votes import no, yes
from pp1q_kernels import shard_processors
from pp1q_kernels import shard_step as ss
from pp1q_kernels.lookup import from_rows
from pp1q_kernels.shard_comm import ShardLayout
from pp1q_kernels.shard_spmd import Gather, Place, Step, drive

_DECIDING = (OpKind.ROUND, OpKind.TARGET_ONLY)


def balanced(vocab: int, world: int) -> tuple[tuple[int, int], ...]:
    """Contiguous shards of floor or ceil(vocab / world) ids (uneven when it does not
    divide), in rank order; every shard non-empty."""
    if not 1 <= world <= vocab:
        raise ConfigError(f"{world} ranks cannot each hold ids of a {vocab}-id vocabulary",
                          key="shard_vocab")
    edges = [r * vocab // world for r in range(world + 1)]
    return tuple(zip(edges[:-1], edges[1:], strict=True))


class ShardedDecisions(RankDecisions):
    """One rank's share of every decision (``comm`` is set when the group forms)."""

    def __init__(self, target, limits: Limits, rank: int, bounds=None) -> None:
        """``bounds``: every rank's (lo, hi), in rank order (default ``balanced``)."""
        self.vocab = limits.vocab
        self.bounds = balanced(limits.vocab, limits.world) if bounds is None else \
            ShardLayout(limits.vocab, tuple(bounds)).bounds  # contiguous, covering, non-empty
        if len(self.bounds) != limits.world:
            raise ConfigError(f"{len(self.bounds)} shards for {limits.world} ranks",
                              key="shard_vocab")
        self.place = Place.of(self.bounds, rank)
        self.shard = shard_of(target, self.place.lo, self.place.hi)
        self.draws = None
        self.comm: ShardComm | None = None

    def closed(self, slot: int) -> None:
        self.shard.close(slot)

    def prepare(self, work: list[tuple[Op, SlotReplica]]) -> None:
        """The target rows of an exchange's decisions in one batch, where the shard can
        (a real model's: HFShard.prepare); every rank prepares the same list."""
        prepare = getattr(self.shard, "prepare", None)
        if prepare is None:
            return
        prepare([(op.slot, s.prefix.tokens, [] if op.kind is OpKind.TARGET_ONLY
                  else [int(t) for t in op.drafts]) for op, s in work])

    def prefill(self, op: Op, s: SlotReplica) -> None:
        """A PREFILL: the shard's K/V of the slot brought up to prompt[:op.upto] in one
        forward (a real model's: HFShard.prefill; the toy shard keeps no cache). Every
        rank gets the same boundary in the op, so every rank holds the same prefix."""
        prefill = getattr(self.shard, "prefill", None)
        if prefill is not None:
            prefill(op.slot, s.prefix.tokens[:op.upto])

    @property
    def evictions(self) -> int:
        return getattr(self.shard, "evictions", 0)  # the toy shard keeps no cache

    def _logits(self, op: Op, s: SlotReplica, drafts: list[int], greedy: bool) -> torch.Tensor:
        """This shard's rows; sampled at T != 1: x / T in float64, element by element as
        pp1q.models.processors does to a whole row (so any split gives the same p)."""
        logits = self.shard.logits(op.slot, s.prefix.tokens, drafts)
        if greedy or s.processors.temperature == 1.0:
            return logits
        return logits.to(torch.float64) / float(s.processors.temperature)

    def decide(self, op: Op, s: SlotReplica) -> rounds.Outcome:
        self._top(s)  # before the dense q's scatter too: no collective for a refusal
        q = self.q_of(op) if op.kind is OpKind.ROUND and not op.greedy else None
        return drive(self.step(op, s, q), self.comm)

    def _top(self, s: SlotReplica) -> dict:
        """The slot's top-k / top-p, refused here (every rank alike, before any
        collective) where shard_processors cannot apply them exactly."""
        top = {"top_k": s.processors.top_k, "top_p": s.processors.top_p}
        shard_processors.check(**top, vocab=self.vocab)
        return top

    def step(self, op: Op, s: SlotReplica, q) -> Step:
        """This rank's share of deciding ``op`` as a shard_spmd step (``q``: its q, from
        ``q_of``; None unless a sampled round). The slot's top-k / top-p apply to a round's
        every row and to a target-only pick alike (shard_step, shard_processors)."""
        pos = len(s.prefix)
        top = self._top(s)
        if op.kind is OpKind.TARGET_ONLY:
            logits = self._logits(op, s, [], s.greedy)
            if s.greedy:
                best = yield from ss.argmax(self.place, logits)
                return rounds.Outcome(0, int(best[0]))
            keys = RoundKeys(self.draw_seed(s), op.generation, op.round_id, pos)
            token = yield from ss.target_only(self.place, logits[0],
                                              target_only_draw(keys, pos), **top)
            return rounds.Outcome(0, token)
        drafts = [int(t) for t in op.drafts]
        logits = self._logits(op, s, drafts, op.greedy)
        x = torch.tensor(drafts, dtype=torch.int64)
        if op.greedy:
            return rounds.Outcome(*(yield from ss.greedy_round(self.place, logits, x)))
        keys = RoundKeys(self.draw_seed(s), op.generation, op.round_id, pos)
        ua, uc, ub = (np.asarray(u)[0] for u in round_draws([keys], len(drafts)))
        accepted, token, _under = yield from ss.sampled_round(
            self.place, logits, q, x, torch.from_numpy(ua), torch.from_numpy(uc), int(ub),
            **top)
        return rounds.Outcome(accepted, token)

    def q_of(self, op: Op):
        """Sparse rows whole (every rank has their bytes); otherwise this rank's slice of
        the dense counts, scattered by rank 0 from the rows it validated (``op.q_rows``)."""
        if all(form == Form.SPARSE for form, _ids, _q in op.rows):
            return from_rows([parse_sparse(ids, q, self.vocab) for _f, ids, q in op.rows])
        counts = None
        if self.place.rank == 0:
            counts = torch.from_numpy(np.stack([r.dense_counts() for r in op.q_rows]))
        return self.comm.scatter_rows(counts, self.bounds, len(op.rows))


class ShardedRankState(RankState):
    def joined(self, coll) -> None:
        self.decisions.comm = ShardComm(coll)

    def votes(self, ops: list[Op]) -> list[np.ndarray]:
        if not ops:  # a heartbeat: no collective (every rank sees the same empty batch)
            return []
        mine = [self.check(op) for op in ops]
        codes = torch.tensor([0 if r is None else REASONS.index(r) + 1 for r in mine])
        every = drive(_gather(codes), self.decisions.comm)  # [N, ops]: who refuses what
        if self.target_delay_s and any(op.kind in _DECIDING for op in ops):
            time.sleep(self.target_delay_s)  # simulated forward pass (demo), every rank
        # the target rows of every decision below in one batch where the shard can
        self.decisions.prepare([(op, self.slots[op.slot]) for i, op in enumerate(ops)
                                if mine[i] is None and not bool(every[:, i].any())
                                and op.kind in _DECIDING])
        out = []
        for i, op in enumerate(ops):
            if mine[i] is not None:
                out.append(no(mine[i]))
            elif bool(every[:, i].any()) or op.kind not in (*_DECIDING, OpKind.PREFILL):
                out.append(yes())  # another rank refuses it: nobody decides it
            elif op.kind is OpKind.PREFILL:  # no collective: each rank its own cache
                out.append(self.prefill(op))
            else:
                out.append(self._decide(op))
        return out

    def _decide(self, op: Op) -> np.ndarray:
        try:
            out = self.decisions.decide(op, self.slots[op.slot])
        except GroupError:
            raise
        except Pp1qError as e:  # reached by every rank at the same collective
            return no(e.reason)
        self.decided += 1
        return self.yes_with(op, out)


def _gather(t: torch.Tensor):
    got = yield Gather(t)
    return got


def sharded_state(rank: int, limits: Limits, target,
                  target_delay_s: float) -> ShardedRankState:
    """``target``: the toy target (cut here) or this rank's HFShard (cut at load)."""
    return ShardedRankState(rank, limits, ShardedDecisions(target, limits, rank),
                            target_delay_s)


