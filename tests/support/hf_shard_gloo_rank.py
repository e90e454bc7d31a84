"""One rank of a real-model vocabulary-sharded group over gloo (test_hf_shard.py):

    python hf_shard_gloo_rank.py RANK WORLD PORT CHECKPOINT_DIR OUT.json

Loads the checkpoint, keeps its rows of the LM head (HFShard, the uneven split of
hf_shard_cases), joins the group as a verifier rank does and plays the scenario through
ShardedDecisions. Writes its decisions, every collective's size and the seconds spent.
"""

from __future__ import annotations

import json
import sys
import time

from hf_shard_cases import DRAWS, bounds, limits, play

from pp1q.models.hf import load_checkpoint
from pp1q.models.hf_shard import HFShard
from pp1q.runtime.settings import DEFAULT_SHARD_KV_BUDGET
from pp1q.verifier.ranks.collective import Collective, Rendezvous
from pp1q.verifier.ranks.shard_collective import ShardComm
from pp1q.verifier.ranks.sharded import ShardedDecisions
from pp1q_kernels.shard_spmd import CollectiveLog

JOIN_S, COLLECTIVE_S = 120.0, 120.0  # bounds: a lost peer fails the run, never hangs it


def main(rank: int, world: int, port: int, checkpoint: str, out: str) -> None:
    ckpt = load_checkpoint(checkpoint)
    b = bounds(world, ckpt.vocab)
    shard = HFShard.from_checkpoint(ckpt, *b[rank], kv_budget_bytes=DEFAULT_SHARD_KV_BUDGET)
    tokenizer, vocab = ckpt.tokenizer, ckpt.vocab
    del ckpt  # the shard keeps the decoder and its rows only
    lim = limits(world, vocab)
    coll = Collective(Rendezvous(rank, world, ("127.0.0.1", port), "gloo", JOIN_S,
                                 COLLECTIVE_S), lim)
    decisions = ShardedDecisions(shard, lim, rank, b)
    log = CollectiveLog()
    decisions.comm, decisions.draws = ShardComm(coll, log), DRAWS
    t0 = time.perf_counter()
    results = play(decisions, tokenizer, rank)
    seconds = time.perf_counter() - t0
    with open(out, "w") as f:
        json.dump({"results": results, "log": log.entries, "seconds": seconds,
                   "cached_tokens": shard.cached_tokens}, f)
    coll.close()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]), sys.argv[4], sys.argv[5])
