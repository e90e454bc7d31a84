"""A verifier daemon with a planted verification bug, used only by the distribution test.

The bug, a real one in the wild: at a rejection the correction token is drawn from the
target row p_i itself instead of the residual max(p_i - q_i, 0). Output then over-weights
tokens the drafter already proposes well; the chi-square test must reject it.
Run exactly like ``pp1q verifier`` (same options).
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np

from pp1q.cli import verifier as verifier_command
from pp1q.cli._daemon import run_daemon
from pp1q.core.rng import Domain, uniform53
from pp1q.core.verify import pick
from pp1q.verifier import rounds
from pp1q.verifier.daemon import serve
from pp1q.verifier.scheduler import Scheduler


class CorrectionFromTargetScheduler(Scheduler):
    def decide_sampled(self, p, q_rows, drafts, keys):
        out = rounds.sampled(p, q_rows, drafts, keys)
        if out.accepted == len(drafts):
            return out
        i = out.accepted
        u = uniform53(keys.seed, keys.generation, keys.round_id, keys.first_position + i,
                      Domain.CORRECTION)
        return rounds.Outcome(i, int(pick(np.asarray(p[i])[None], np.array([u]))[0]))


def main() -> int:
    parser = argparse.ArgumentParser(prog="planted_verifier")
    verifier_command.add_arguments(parser)
    args = parser.parse_args()
    planted = functools.partial(serve, scheduler_cls=CorrectionFromTargetScheduler)
    return run_daemon(args, "verifier", planted)


if __name__ == "__main__":
    sys.exit(main())
