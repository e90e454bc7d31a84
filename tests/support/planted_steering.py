"""A steering worker, and a verifier keyed the old way, for tests/verifier/test_steering.py.

The worker is a planted attacker behind the worker's own seam (a ``Proposer`` passed to
``serve``). It knows everything it receives (the STEP's seed and keys, the committed
prefix) and the public target model. Each round, for x_1, it predicts the verifier's
acceptance draw as the first revision keyed it, u = u53(STEP seed, g, r, a, ACCEPTANCE),
and asks: would a row that puts almost all its mass on its favourite token f pass the
ratio test with that draw? If so it sends that row; otherwise the honest drafter's row.
Either way x_1 is drawn honestly from the row sent, with the PROPOSAL key, so the
verifier's proposal re-derivation (rounds.proposal_matches) holds on every round. The
attack is in *choosing q* with knowledge of the acceptance draw: f is sent exactly when
it will be accepted. Under the old keying that raises f's output probability; under
verifier-owned draws the prediction is independent of the real draw, the choice of q is
then independent of every draw that decides the round, and the output stays exact.

``OldKeying`` is the verifier half of the demonstration: the production LocalDecider
with the first revision's keying (every draw keyed by the request seed) injected
through the Decider seam, as a test-side Decider; production has no such switch.

Run as ``planted_steering.py worker ...`` (options of ``pp1q worker``) or
``planted_steering.py verifier ...`` (options of ``pp1q verifier``).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from fractions import Fraction

import msgspec
import numpy as np

from pp1q.core.drawkey import DrawKeys
from pp1q.core.q import MASS, DyadicRow, build_row, sample
from pp1q.core.rng import Domain, accepts, proposal_u24, uniform53
from pp1q.models.toy import ToyTarget
from pp1q.verifier.decider import LocalDecider
from pp1q.wire import Form
from pp1q.wire.validate import step_form
from pp1q.worker.drafting import Proposer

log = logging.getLogger("pp1q.worker")

FAVOURITE_P = 0.2  # the attacker favours the token whose target probability is nearest this
STEER_LOGIT = 8.0  # q(f) = e^8 / (e^8 + V - 1): about 0.995 at vocabulary 16


def favourite(p: np.ndarray) -> int:
    return int(np.argmin(np.abs(p - FAVOURITE_P)))


class Steering(Proposer):
    """Honest rows, except x_1's row when the predicted acceptance draw lets f through."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.target = ToyTarget(model.spec)  # the public target: the attacker has it too
        self.steered = 0

    def rows(self, step, prefix):
        honest = super().rows(step, prefix)
        if step_form(step) is Form.TOKEN_ONLY:
            yield from honest
            return
        p = self.target.probs(prefix, [])[0]
        f = favourite(p)
        logits = np.zeros(p.size)
        logits[f] = STEER_LOGIT
        row = build_row(logits, temperature=1.0, top_k=step.top_k or None)
        u = uniform53(step.seed, step.generation, step.round_id, step.first_position,
                      Domain.ACCEPTANCE)  # the verifier's draw, as the first revision keyed it
        if not accepts(u, Fraction(float(p[f])), Fraction(row.count_of(f), MASS)):
            yield from honest
            return
        self.steered += 1
        log.info("steering: f=%d sent (%d rounds so far)", f, self.steered)
        x1 = sample(row, proposal_u24(step.seed, step.generation, step.round_id,
                                      step.first_position))  # honestly drawn from q sent
        yield x1, row
        if step.depth > 1:  # rows 2..D: the honest drafter's chain after x_1, same keys
            later = msgspec.structs.replace(step, first_position=step.first_position + 1,
                                            last_committed=step.last_committed + 1,
                                            depth=step.depth - 1)
            yield from super().rows(later, [*prefix, x1])


class ProposalSteering(Proposer):
    """What verifier-owned draws do not stop (docs/security.md): the worker must know
    the PROPOSAL draw, so it can build q around it. One count of f placed exactly where
    the draw lands: x_1 = sample(q, u24) = f (the re-derivation holds) and q(f) = 2^-24,
    so p(f)/q(f) >= 1 and f is accepted whatever the acceptance draw."""

    def rows(self, step, prefix):
        honest = super().rows(step, prefix)
        f = favourite(ToyTarget(self.model.spec).probs(prefix, [])[0])
        u = proposal_u24(step.seed, step.generation, step.round_id, step.first_position)
        if step_form(step) is Form.TOKEN_ONLY or not 0 < f < self.model.vocab - 1:
            yield from honest
            return
        ids, counts = [f - 1, f, f + 1], [u, 1, MASS - u - 1]
        keep = [i for i, c in enumerate(counts) if c]
        row = DyadicRow(self.model.vocab, np.array([ids[i] for i in keep]),
                        np.array([counts[i] for i in keep]))
        yield sample(row, u), row
        if step.depth > 1:
            later = msgspec.structs.replace(step, first_position=step.first_position + 1,
                                            last_committed=step.last_committed + 1,
                                            depth=step.depth - 1)
            yield from super().rows(later, [*prefix, f])


class WorkerKnownDraws(DrawKeys):
    """The first revision's keying: the verifier's draws keyed by the STEP's seed."""

    def __init__(self) -> None:
        super().__init__(bytes(16))

    def seed_for(self, seed: int) -> int:
        return int(seed)


class OldKeying(LocalDecider):
    """The production decider with the first revision's (worker-known) draw keys."""

    def __init__(self, target, **kw) -> None:
        kw["draws"] = WorkerKnownDraws()
        super().__init__(target, **kw)


def main() -> int:
    from pp1q.cli import verifier as verifier_command
    from pp1q.cli import worker as worker_command
    from pp1q.cli._daemon import run_daemon

    role = sys.argv.pop(1)
    parser = argparse.ArgumentParser(prog=f"planted_steering {role}")
    if role == "worker":
        from pp1q.worker.daemon import serve

        worker_command.add_arguments(parser)
        planted = functools.partial(serve, proposer=Steering)
    else:
        from pp1q.verifier.daemon import Deciders, serve

        verifier_command.add_arguments(parser)
        planted = functools.partial(serve, deciders=Deciders(local=OldKeying))
    return run_daemon(parser.parse_args(), role, planted)


if __name__ == "__main__":
    sys.exit(main())
