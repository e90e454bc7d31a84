"""A verifier daemon with a planted verification bug, used only by the distribution tests
(tests/verifier/test_daemon_distribution.py, tests/tools/test_chaos_matrix.py).

``--planted correction_from_target`` (default), a real bug in the wild: at a rejection
the correction token is drawn from the target row p_i itself instead of the residual
max(p_i - q_i, 0). Output then over-weights tokens the drafter already proposes well;
the goodness-of-fit judge (stats.py) must reject it.
``--planted processors_one_path``: the target's processors (temperature, top-k, top-p)
are applied to target-only steps but not to a round's p. The bug
is the daemon's Decider, passed to ``serve`` the way production passes KernelDecider
(pp1q.verifier.daemon.Deciders). Run exactly like ``pp1q verifier`` (same options).
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np

from pp1q.cli import verifier as verifier_command
from pp1q.cli._daemon import run_daemon
from pp1q.core.outcomes import StepKind
from pp1q.core.rng import Domain, uniform53
from pp1q.core.verify import RoundKeys, pick
from pp1q.verifier import rounds
from pp1q.verifier.daemon import Deciders, serve
from pp1q.verifier.decider import LocalDecider
from pp1q.verifier.kernel_decider import KernelDecider


class CorrectionFromTarget(KernelDecider):
    """The production decider, except that a rejection's correction is drawn from p_i
    (keyed by the request seed, as draws were before the verifier had its own)."""

    async def decide_round(self, job, step, ready):
        out, kind = await super().decide_round(job, step, ready)
        drafts = list(ready.draft_ids)
        if ready.greedy or out.accepted == len(drafts):
            return out, kind
        i = out.accepted
        p = self.rows.rows(job.slot, job.prefix.tokens, drafts, logits=False)
        u = uniform53(job.req.seed, step.generation, step.round_id, step.first_position + i,
                      Domain.CORRECTION)
        return rounds.Outcome(i, int(pick(np.asarray(p[i])[None], np.array([u]))[0])), kind


class ProcessorsOnOnePath(LocalDecider):
    """The one-process decider (LocalDecider: the same rule, one request at a time), except
    that a round's p skips the request's processors and its draws are keyed by the
    request seed, not the verifier's draw secret."""

    async def decide_round(self, job, step, ready):
        keys = RoundKeys(job.req.seed, step.generation, step.round_id, step.first_position)
        out = self.rows.round(job.slot, job.prefix.tokens, list(ready.draft_ids),
                              ready.q_rows, keys, ready.greedy)  # processors dropped
        return out, StepKind.GREEDY if ready.greedy else StepKind.SPECULATIVE


PLANTED = {"correction_from_target": CorrectionFromTarget,
           "processors_one_path": ProcessorsOnOnePath}


def main() -> int:
    parser = argparse.ArgumentParser(prog="planted_verifier")
    verifier_command.add_arguments(parser)
    parser.add_argument("--planted", choices=sorted(PLANTED), default="correction_from_target")
    args = parser.parse_args()
    decider = PLANTED[args.planted]
    planted = functools.partial(serve, deciders=Deciders(local=decider))
    return run_daemon(args, "verifier", planted)


if __name__ == "__main__":
    sys.exit(main())
