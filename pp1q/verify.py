"""Stable import path ``pp1q.verify``; the module lives in pp1q.core.verify. This name is an
alias of that same module object, so attributes, monkeypatching and identity agree."""

import sys

from pp1q.core import verify as _module

sys.modules[__name__] = _module
