"""What one scheduling step decides (shared by every decision path; re-exported by rounds),
and why a proposal gave nothing (``Fallback``, re-exported by link)."""

from __future__ import annotations

from dataclasses import dataclass

from pp1q.core.errors import Reason
from pp1q.core.outcomes import FallbackCause


@dataclass(frozen=True)
class Outcome:
    accepted: int  # drafts accepted (0 for a target-only step)
    token: int  # correction, bonus or target-only token


@dataclass(frozen=True)
class Fallback:
    """Why a proposal produced nothing consumable."""

    cause: FallbackCause
    reason: Reason
    detail: str = ""
