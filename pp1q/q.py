"""Stable import path ``pp1q.q``; the module lives in pp1q.core.q. This name is an
alias of that same module object, so attributes, monkeypatching and identity agree."""

import sys

from pp1q.core import q as _module

sys.modules[__name__] = _module
