"""Verifier ranks: bytes between ranks and time per round, replicated vs vocabulary-sharded.

One request, depth 5, vocabulary 129280, q from the toy drafter (dense: every id; sparse:
top-32), one ROUND op per exchange through the real exchange path (ranks_peer.py: gloo
over loopback, a process per rank). ``replicated`` (today's ``--ranks N``): rank 0
broadcasts the op with its q rows, the decider computes whole target rows and decides.
``sharded`` (``--shard-vocab``): dense q scattered by slices, each rank computes its
shard's logits and the ranks decide together (pp1q_kernels.shard_step). Bytes: what all
ranks send per round (direct-exchange model: a root sends its payload to each other
rank, an all-reduce/all-gather participant its contribution), payload only. Time:
median exchange on rank 0, target rows included. 1 rank: a group of one through the
same path (replicated: the one-process decision rule on whole rows; sharded: the
sharded sampler with one shard), so every row pays the same exchange overhead.

``model`` (``pp1q bench ranks --model embedded|PATH``): the sharded design over a real
model instead (pp1q.models.hf_shard), 1 and 2 ranks, dense and top-32 q: every rank
loads the checkpoint and keeps its rows of the LM head, and the time per round includes
each rank's forward (D + 1 new tokens on a reused K/V cache) and its rows' product.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile

import numpy as np

from pp1q.runtime.launcher import run_together

TITLE = "Verifier ranks: bytes and time per round, replicated vs --shard-vocab (V 129280, D 5)"

RUN_S = 600  # bound on one group's run


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group(world: int, design: str, form: str, rounds: int,
           model: str | None = None) -> tuple[float, float]:
    """(median ms per round on rank 0, bytes per round all ranks sent)."""
    port = _port()
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"r{r}.json") for r in range(world)]
        extra = [] if model is None else [model]
        codes = run_together([[sys.executable, "-m", "pp1q.tools.bench.ranks_peer", str(r),
                               str(world), str(port), design, form, str(rounds), outs[r],
                               *extra] for r in range(world)], RUN_S)
        if codes != [0] * world:
            raise RuntimeError(f"ranks exited {codes}")
        runs = []
        for o in outs:
            with open(o) as f:
                runs.append(json.load(f))
    ms = float(np.median(runs[0]["times"])) * 1e3
    return ms, sum(r["sent"] for r in runs) / rounds


def _checkpoint(model: str) -> str:
    """A folder each rank loads in about a second: a GGUF (``embedded`` included) is
    de-quantized once into the model cache (pp1q.tools.realmodel), as the demo does."""
    from pathlib import Path

    from pp1q.models.hf import gguf_cache_entry, load_checkpoint
    from pp1q.models.serving import model_path
    from pp1q.tools.realmodel import default_cache

    path = model_path(model)
    if not Path(path).is_file():
        return str(path)
    load_checkpoint(path, gguf_cache=default_cache())  # writes the entry once
    return str(gguf_cache_entry(path, default_cache()))


def run(quick: bool = False, model: str | None = None) -> list[str]:
    rounds = 5 if quick else 40
    lines = ["| ranks | design | q | bytes/round (all ranks) | ms/round (median) |",
             "|---:|---|---|---:|---:|"]
    if model is not None:
        folder = _checkpoint(model)
        for form in ("dense", "sparse"):
            for world in (1, 2):
                ms, sent = _group(world, "sharded", form, rounds, folder)
                lines.append(f"| {world} | sharded, {model} | {form} | {sent:,.0f} | {ms:.2f} |")
        return lines
    for form in ("dense", "sparse"):
        for world in (1, 2, 3):
            for design in ("replicated", "sharded"):
                ms, sent = _group(world, design, form, rounds)
                lines.append(f"| {world} | {design} | {form} | {sent:,.0f} | {ms:.2f} |")
    return lines
