"""A worker daemon with a planted proposal bug, used only by tests/verifier/test_proposal_check.py.

The bug, a real one in the wild (transformers #47932 / #40949): the token is sampled from
q built at the STEP's temperature, but the q put on the wire is built at temperature 1.
The bug is the worker's Proposer, passed to ``serve`` the way production passes its own.
Run exactly like ``pp1q worker`` (same options).
"""

from __future__ import annotations

import argparse
import functools
import sys

import msgspec

from pp1q.cli import worker as worker_command
from pp1q.cli._daemon import run_daemon
from pp1q.worker.daemon import serve
from pp1q.worker.drafting import Proposer


class WrongQ(Proposer):
    """Tokens drawn at the STEP's temperature, q rows built at temperature 1."""

    def rows(self, step, prefix):
        sent = super().rows(msgspec.structs.replace(step, temperature=1.0), prefix)
        for (token, _), (_, wrong_q) in zip(super().rows(step, prefix), sent, strict=True):
            yield token, wrong_q


def main() -> int:
    parser = argparse.ArgumentParser(prog="planted_worker")
    worker_command.add_arguments(parser)
    args = parser.parse_args()
    planted = functools.partial(serve, proposer=WrongQ)
    return run_daemon(args, "worker", planted)


if __name__ == "__main__":
    sys.exit(main())
