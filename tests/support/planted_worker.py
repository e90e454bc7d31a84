"""A worker daemon with a planted proposal bug, used only by tests/verifier/test_proposal_check.py.

The bug, a real one in the wild (transformers #47932 / #40949): the token is sampled from
q built at the STEP's temperature, but the q put on the wire is built at temperature 1.
Run exactly like ``pp1q worker`` (same options).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from pp1q.cli import worker as worker_command
from pp1q.worker import drafting
from pp1q.worker.proposer import propose


def propose_with_wrong_q(model, prefix, spec):
    sent = propose(model, prefix, dataclasses.replace(spec, temperature=1.0))
    for (token, _), (_, wrong_q) in zip(propose(model, prefix, spec), sent, strict=True):
        yield token, wrong_q


def main() -> int:
    parser = argparse.ArgumentParser(prog="planted_worker")
    worker_command.add_arguments(parser)
    drafting.propose = propose_with_wrong_q
    return worker_command.run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
