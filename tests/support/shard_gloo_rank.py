"""One rank of a sharded-sampler run over real gloo processes (test_ranks_shard_gloo.py).

    python shard_gloo_rank.py RANK WORLD PORT ROUNDS OUT.json [DEVICE]

Joins the group the way a verifier rank does (pp1q.verifier.ranks.collective), then
decides ROUNDS rounds of shard_cases over its shard of SPLITS[WORLD - 2]: dense q
scattered from rank 0 by slices, sparse q held whole. Writes its decisions and the
size of every collective it took part in. DEVICE (default: none) puts the group's
collectives on that device the way the NCCL backend does (``Collective.device``: each
tensor copied there and back around the collective); ``cpu`` runs that path over gloo,
``cuda`` on a machine with one GPU per rank.
"""

from __future__ import annotations

import json
import sys

import torch
from shard_cases import SPLITS, D, V, cases, round_keys, round_step

from pp1q.verifier.ranks.collective import Collective, Rendezvous
from pp1q.verifier.ranks.ops import Limits
from pp1q.verifier.ranks.shard_collective import ShardComm
from pp1q_kernels.shard_spmd import CollectiveLog, Place, drive

JOIN_S, COLLECTIVE_S = 60.0, 30.0  # bounds: a lost peer fails the run, never hangs it


def main(rank: int, world: int, port: int, rounds: int, out: str, device: str) -> None:
    rv = Rendezvous(rank, world, ("127.0.0.1", port), "gloo", JOIN_S, COLLECTIVE_S)
    coll = Collective(rv, Limits(world, 1, D, V, V, 8))
    if device != "none":  # what Collective sets for NCCL: cuda:LOCAL_RANK
        coll.device = torch.device(device)
    layout = SPLITS[world - 2]
    log = CollectiveLog()
    comm = ShardComm(coll, log)
    place = Place.of(layout.bounds, rank)
    pool = cases()
    results = []
    for k in range(rounds):
        case = pool[k % len(pool)]
        if case.sparse:
            q = case.q_sparse
        else:
            q = comm.scatter_rows(case.q_dense if rank == 0 else None, layout.bounds, D)
        results.append(list(drive(round_step(place, case, round_keys(k), q=q), comm)))
    with open(out, "w") as f:
        json.dump({"results": results, "log": log.entries}, f)
    coll.close()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]), sys.argv[5],
         sys.argv[6] if len(sys.argv) > 6 else "none")
