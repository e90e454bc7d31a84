"""A ranked verifier with a planted bug, used only by tests/verifier/ranks/test_ranks_failures.py.

The bug, a real one in the wild (vLLM #17498): tensor-parallel ranks each sample with
their own noise and keep what they drew, so they accept different tokens. Here every
rank but the op's decider commits its own decision (the request seed salted with the
rank) instead of the one every rank voted on. The per-round agreement check must catch
it: the next op of that slot finds the committed prefixes differ, every rank discards
it, and the request fails with ``rank_disagreement``. The bug is each rank's
RankDecisions, passed to ``serve`` the way production passes its own
(pp1q.verifier.daemon.Deciders.rank). Run exactly like ``pp1q verifier`` (same
options); it spawns its ranks as itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys

from pp1q.cli import verifier as verifier_command
from pp1q.cli._daemon import run_daemon
from pp1q.verifier.daemon import Deciders, serve
from pp1q.verifier.ranks.ops import OpKind
from pp1q.verifier.ranks.replica import RankDecisions, committed_tokens

SALT = 0x5EED_5EED  # the rank's "own noise"


class IndependentSampler(RankDecisions):
    """Every rank but the op's decider commits the decision it draws with its own noise."""

    def committed(self, rank, op, s, v):
        if op.kind in (OpKind.ROUND, OpKind.TARGET_ONLY) and rank != op.decider:
            own = self.decide(op, dataclasses.replace(s, seed=s.seed ^ (SALT * (rank + 1))))
            return committed_tokens(op, own.accepted, own.token)
        return super().committed(rank, op, s, v)


def main() -> int:
    parser = argparse.ArgumentParser(prog="planted_ranks")
    verifier_command.add_arguments(parser)
    args = parser.parse_args()
    planted = functools.partial(serve, deciders=Deciders(rank=IndependentSampler),
                                child_command=[sys.executable, __file__])
    return run_daemon(args, "verifier", planted)


if __name__ == "__main__":
    sys.exit(main())
