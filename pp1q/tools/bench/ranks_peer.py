"""One rank of ``pp1q bench ranks``, run as a child process:

    python -m pp1q.tools.bench.ranks_peer RANK WORLD PORT DESIGN FORM ROUNDS OUT [MODEL]

(DESIGN: replicated or sharded; FORM: dense or sparse q; MODEL: a checkpoint path for
the sharded design over a real model, pp1q.models.hf_shard: each rank loads it and keeps
its rows of the LM head; q rows then come from seeded random logits over its vocabulary,
the prompt is PROMPT_REAL and the slot's K/V is reused round after round.)

Joins a gloo group as a verifier rank does, then runs ROUNDS exchanges of one ROUND op
(one request, depth 5, vocabulary 129280, q from the toy drafter) through the real
exchange path (pp1q.verifier.ranks.collective.Collective.exchange): ``replicated``
broadcasts the q rows in the op and the decider decides from whole rows (replica.py),
``sharded`` scatters dense q by slices and every rank decides from its shard
(sharded.py). Every torch.distributed call is counted (``CountingDist``). Rank 0 writes
each exchange's time; every rank writes the bytes it sent.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from pp1q.core.drawkey import DrawKeys
from pp1q.core.prefix import Prefix
from pp1q.core.q import MASS, build_row, sample
from pp1q.core.rng import proposal_u24
from pp1q.models.toy import ToyDrafter, ToySpec, ToyTarget
from pp1q.verifier.ranks.collective import Collective, Rendezvous
from pp1q.verifier.ranks.launch import limits_of
from pp1q.verifier.ranks.ops import FLAG_STOP, Form, Op, OpKind
from pp1q.verifier.ranks.replica import RankDecisions, RankState
from pp1q.verifier.ranks.sharded import sharded_state
from pp1q.wire import WIRE_V2
from pp1q.wire.session_config import DEFAULT_MAX_SUPPORT, verifier_config

VOCAB = 129280
DEPTH = 5
TOP_K = 32
CHAINS = 4  # q chains cycled through (built once, outside the timed exchanges)
PROMPT = [3, 7]
PROMPT_REAL = list(range(100, 132))  # 32 ids: a real model's committed prefix to start
JOIN_S, COLLECTIVE_S = 120.0, 120.0


class CountingDist:
    """torch.distributed with the bytes this rank sends counted, direct exchange model:
    a broadcast or scatter root sends its payload to each other rank, an all-gather or
    all-reduce participant sends its contribution to each other rank."""

    def __init__(self, dist, world: int, rank: int) -> None:
        self.dist, self.world, self.rank, self.sent = dist, world, rank, 0

    def __getattr__(self, name):
        return getattr(self.dist, name)

    def _add(self, t) -> None:
        self.sent += t.numel() * t.element_size() * (self.world - 1)

    def broadcast(self, t, src, group=None):
        if self.rank == src:
            self._add(t)
        return self.dist.broadcast(t, src, group=group)

    def all_reduce(self, t, group=None):
        self._add(t)
        return self.dist.all_reduce(t, group=group)

    def all_gather(self, outs, t, group=None):
        self._add(t)
        return self.dist.all_gather(outs, t, group=group)

    def scatter(self, out, parts, src=0, group=None):
        if self.rank == src:
            self._add(out)
        return self.dist.scatter(out, parts, src=src, group=group)


def chains(form: str):
    drafter = ToyDrafter.preset(ToySpec(vocab=VOCAB), "close")
    out = []
    for c in range(CHAINS):
        rows, drafts = [], []
        backbone = drafter.backbone(PROMPT, DEPTH)
        prev = PROMPT[-1]
        for i in range(DEPTH):
            row = build_row(drafter.row_logits(backbone[i], prev),
                            top_k=TOP_K if form == "sparse" else None)
            prev = sample(row, proposal_u24(c + 1, 1, 1, i))
            rows.append(row)
            drafts.append(prev)
        out.append((rows, drafts))
    return out


def random_chains(form: str, vocab: int):
    """q rows over a real model's vocabulary from seeded logits, drafts their own draws."""
    g = np.random.default_rng(7)
    out = []
    for c in range(CHAINS):
        rows = [build_row(g.normal(0, 2.0, vocab), top_k=TOP_K if form == "sparse" else None)
                for _ in range(DEPTH)]
        out.append((rows, [sample(r, proposal_u24(c + 1, 1, 1, i)) for i, r in enumerate(rows)]))
    return out


def _real_target(model: str, world: int, rank: int):
    """(this rank's HFShard of ``model``, the wire identity naming it)."""
    from pp1q.models.hf import load_checkpoint
    from pp1q.models.hf_shard import HFShard
    from pp1q.runtime.settings import DEFAULT_SHARD_KV_BUDGET
    from pp1q.verifier.ranks.sharded import balanced
    from pp1q.wire.session_config import engine_identity

    ckpt = load_checkpoint(model)
    shard = HFShard.from_checkpoint(ckpt, *balanced(ckpt.vocab, world)[rank],
                                    kv_budget_bytes=DEFAULT_SHARD_KV_BUDGET)
    return shard, engine_identity(ckpt.vocab, ckpt.tokenizer_digest, "bench", ckpt.identity)


def _round_op(state: RankState, k: int, sharded: bool, chain) -> Op:
    rows, drafts = chain
    vocab = state.limits.vocab
    s = state.slots[0]
    wire = []
    for r in rows:
        if r.support_size and r.support_size < vocab and r.support_size <= TOP_K:
            ids, q = r.to_sparse()
            wire.append((Form.SPARSE, ids.astype(np.int32), q))
        else:
            wire.append((Form.SHARDED, None, None) if sharded else
                        (Form.DENSE, None, (r.dense_counts() / MASS).astype(np.float32)))
    return Op(OpKind.ROUND, 0, generation=1, round_id=k + 1, decider=0, seed=1,
              prefix_len=len(s.prefix), prefix_digest=s.prefix.digest,
              drafts=np.asarray(drafts, np.int32), rows=tuple(wire), q_rows=tuple(rows))


def main(rank: int, world: int, port: int, design: str, form: str, rounds: int,
         out: str, model: str | None = None) -> None:
    sharded = design == "sharded"
    if model is not None:
        if not sharded:
            raise SystemExit("a real model runs on vocabulary-sharded ranks only")
        target, spec = _real_target(model, world, rank)
        prompt = PROMPT_REAL
    else:
        spec = ToySpec(vocab=VOCAB)
        target, prompt = ToyTarget(spec), PROMPT
    limits = limits_of(verifier_config(spec, (WIRE_V2,), 1, DEPTH, DEFAULT_MAX_SUPPORT),
                       world, sharded)
    coll = Collective(Rendezvous(rank, world, ("127.0.0.1", port), "gloo", JOIN_S,
                                 COLLECTIVE_S), limits)
    counting = CountingDist(coll._dist, world, rank)
    coll._dist = counting  # before the state's ShardComm takes it
    state = (sharded_state(rank, limits, target, 0.0) if sharded
             else RankState(rank, limits, RankDecisions(target, limits)))
    state.decisions.draws = DrawKeys.from_hex("11" * 32)
    state.joined(coll)
    times, sent = [], 0
    work = None
    if rank == 0:
        work = chains(form) if model is None else random_chains(form, limits.vocab)
    for seq in range(1, rounds + 3):  # OPEN, ROUNDS rounds, STOP
        if seq == 2:
            sent = counting.sent  # the rounds' bytes only
        if seq == rounds + 2:
            sent = counting.sent - sent
        if rank != 0:
            _, _, flags = coll.exchange(state, seq)
            if flags & FLAG_STOP:
                break
            continue
        if seq == 1:
            ops = [Op(OpKind.OPEN, 0, seed=1, prefix_len=len(prompt),
                      prefix_digest=Prefix(prompt).digest,
                      prompt=np.asarray(prompt, np.int32))]
        elif seq <= rounds + 1:
            ops = [_round_op(state, seq, sharded, work[seq % CHAINS])]
        else:
            coll.exchange(state, seq, [], FLAG_STOP)
            break
        t0 = time.perf_counter()
        _, verdicts, _ = coll.exchange(state, seq, ops)
        if seq > 1:
            times.append(time.perf_counter() - t0)
        if not verdicts[0].ok:
            raise SystemExit(f"round refused: {verdicts[0]}")
    with open(out, "w") as f:
        json.dump({"times": times, "sent": sent, "rounds": rounds,
                   "fed_tokens": getattr(state.decisions.shard, "fed_tokens", None)
                   if sharded else None}, f)
    coll.close()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), int(a[2]), a[3], a[4], int(a[5]), a[6],
         a[7] if len(a) > 7 else None)
