"""The ``pp1q`` command. Each subcommand lives in its own module under pp1q.cli.

A command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``; it is imported only when its subcommand runs (every one for the
top-level help).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import NoReturn

COMMANDS = {
    "selfcheck": "pp1q.cli.selfcheck",
    "bench": "pp1q.cli.bench",
    "worker": "pp1q.cli.worker",
    "verifier": "pp1q.cli.verifier",
    "generate": "pp1q.cli.generate",
    "demo": "pp1q.cli.demo",
    "replay": "pp1q.cli.replay",
    "chaos": "pp1q.cli.chaos",
    "soak": "pp1q.cli.soak",
    "train-adapter": "pp1q.cli.train_adapter",
}

# Commands whose run() has closed all it opened when it returns (connections, capture
# files, /metrics, rank groups, log handlers flushed below): interpreter teardown after
# that (torch, numba: ~0.7 s) would only delay every stop and restart.
EXIT_AT_ONCE = frozenset({"worker", "verifier"})


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line on stderr, exit status 2 (as a settings error)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _Parser(
        prog="pp1q",
        description="Exact draft-distribution transport for remote speculative sampling.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {}
    wanted = argv[0] if argv and not argv[0].startswith("-") else None
    for name, path in COMMANDS.items():
        # Help text for every command, but only the chosen one's heavy imports.
        if wanted in (None, name) or wanted not in COMMANDS:
            mod = importlib.import_module(path)
            modules[name] = mod
            p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
            mod.add_arguments(p)
        else:
            sub.add_parser(name)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(modules[args.command].run(args) or 0)


def console() -> NoReturn:
    """The ``pp1q`` executable (and ``python -m pp1q.cli``): ``main`` with the process's
    arguments, its status as the exit status; the daemons skip interpreter teardown."""
    argv = sys.argv[1:]
    code = main(argv)
    if argv and argv[0] in EXIT_AT_ONCE:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)
