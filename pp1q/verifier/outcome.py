"""What one scheduling step decides (shared by every decision path; re-exported by rounds)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    accepted: int  # drafts accepted (0 for a target-only step)
    token: int  # correction, bonus or target-only token
