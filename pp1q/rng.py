"""Stable import path ``pp1q.rng``; the module lives in pp1q.core.rng. This name is an
alias of that same module object, so attributes, monkeypatching and identity agree."""

import sys

from pp1q.core import rng as _module

sys.modules[__name__] = _module
