"""``python -m pp1q.cli``: the ``pp1q`` command (spawned ranks and tests use this form)."""

from pp1q.cli import console

console()
