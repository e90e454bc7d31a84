"""Verifier ranks: bytes between ranks and time per round, replicated vs vocabulary-sharded.

One request, depth 5, vocabulary 129280, q from the toy drafter (dense: every id; sparse:
top-32), one ROUND op per exchange through the real exchange path (ranks_peer.py: gloo
over loopback, a process per rank). ``replicated`` (today's ``--ranks N``): rank 0
broadcasts the op with its q rows, the decider computes whole target rows and decides.
``sharded`` (``--shard-vocab``): dense q scattered by slices, each rank computes its
shard's logits and the ranks decide together (pp1q_kernels.shard_step). Bytes: what all
ranks send per round (direct-exchange model: a root sends its payload to each other
rank, an all-reduce/all-gather participant its contribution), payload only. Time:
median exchange on rank 0, target rows included. 1 rank: the one-process decision
(toy target probs + KernelRounds) and the sharded sampler over one simulated rank.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

TITLE = "Verifier ranks: bytes and time per round, replicated vs --shard-vocab (V 129280, D 5)"

RUN_S = 600  # bound on one group's run


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group(world: int, design: str, form: str, rounds: int) -> tuple[float, float]:
    """(median ms per round on rank 0, bytes per round all ranks sent)."""
    port = _port()
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"r{r}.json") for r in range(world)]
        procs = [subprocess.Popen([sys.executable, "-m", "pp1q.tools.bench.ranks_peer", str(r),
                                   str(world), str(port), design, form, str(rounds), outs[r]])
                 for r in range(world)]
        try:
            codes = [p.wait(RUN_S) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if codes != [0] * world:
            raise RuntimeError(f"ranks exited {codes}")
        runs = []
        for o in outs:
            with open(o) as f:
                runs.append(json.load(f))
    ms = float(np.median(runs[0]["times"])) * 1e3
    return ms, sum(r["sent"] for r in runs) / rounds


def _one_rank(form: str, rounds: int) -> tuple[float, float]:
    """(one process: target probs + KernelRounds, sharded sampler on one rank) ms/round."""
    import torch
    from pp1q_kernels import shard_step as ss
    from pp1q_kernels.lookup import from_rows
    from pp1q_kernels.shard_spmd import simulate

    from pp1q.core.verify import RoundKeys, round_draws
    from pp1q.models.toy import ToySpec, ToyTarget
    from pp1q.tools.bench.ranks_peer import DEPTH, PROMPT, VOCAB, chains
    from pp1q.verifier.kernel_rounds import KernelRounds

    target, kr, work = ToyTarget(ToySpec(vocab=VOCAB)), KernelRounds(), chains(form)
    a, b = [], []
    bounds = ((0, VOCAB),)
    for k in range(rounds):
        rows, drafts = work[k % len(work)]
        keys = RoundKeys(5, 1, k, len(PROMPT))
        t0 = time.perf_counter()
        kr.sampled([target.probs(PROMPT, drafts)], [rows], [drafts], [keys])
        t1 = time.perf_counter()
        q = from_rows(rows)
        if form == "dense":
            q = torch.from_numpy(np.stack([r.dense_counts() for r in rows]))
        ua, uc, ub = (np.asarray(u)[0] for u in round_draws([keys], DEPTH))
        logits = torch.from_numpy(target.logits(PROMPT, drafts))
        simulate(bounds, lambda pl, q=q, logits=logits, ua=ua, uc=uc, ub=ub, d=drafts:
                 ss.sampled_round(pl, logits, q, torch.tensor(d), torch.from_numpy(ua),
                                  torch.from_numpy(uc), int(ub)))
        t2 = time.perf_counter()
        a.append(t1 - t0)
        b.append(t2 - t1)
    return float(np.median(a)) * 1e3, float(np.median(b)) * 1e3


def run(quick: bool = False) -> list[str]:
    rounds = 5 if quick else 30
    lines = ["| ranks | design | q | bytes/round (all ranks) | ms/round (median) |",
             "|---:|---|---|---:|---:|"]
    for form in ("dense", "sparse"):
        one, one_sharded = _one_rank(form, rounds)
        lines.append(f"| 1 | one process (KernelDecider rule) | {form} | 0 | {one:.2f} |")
        lines.append(f"| 1 | sharded sampler, one rank | {form} | 0 | {one_sharded:.2f} |")
        for world in (2, 3):
            for design in ("replicated", "sharded"):
                ms, sent = _group(world, design, form, rounds)
                lines.append(f"| {world} | {design} | {form} | {sent:,.0f} | {ms:.2f} |")
    return lines
