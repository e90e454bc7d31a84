"""Per-request token bookkeeping shared by the cached engines (no torch, no model).

A request's tokens are ``committed + spec``; the KV cache holds K/V for a prefix of
them, ``cached`` tokens long. Engines feed ``tokens[cached:]`` to the model and crop the
cache to the length ``commit`` / ``reset`` / ``feed_start`` return; keeping this
arithmetic in one small class keeps the cache rules the same for the drafter and the
target, and testable without a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pp1q.core.errors import LocalProtocolError, Reason


@dataclass
class Ledger:
    committed: list[int]
    spec: list[int] = field(default_factory=list)
    cached: int = 0  # tokens[:cached] have K/V in the cache

    @classmethod
    def start(cls, committed: Sequence[int]) -> Ledger:
        ids = [int(t) for t in committed]
        if not ids:
            # the first row needs a token to condition on (a BOS if nothing else)
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "a request needs at least one token")
        return cls(committed=ids)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed ``tokens`` (the next chunk of a prompt prefilled in parts);
        refused while speculative tokens are outstanding (they would sit before them)."""
        if self.spec:
            raise LocalProtocolError(
                Reason.STATE_NOT_ALLOWED, f"extend with {len(self.spec)} speculative tokens held")
        self.committed += [int(t) for t in tokens]

    @property
    def tokens(self) -> list[int]:
        return self.committed + self.spec

    def commit(self, accepted: int, token: int) -> int:
        """Keep spec[:accepted] + [token]; returns the cache length to keep."""
        if isinstance(accepted, bool) or not 0 <= int(accepted) <= len(self.spec):
            raise LocalProtocolError(
                Reason.BAD_POSITION, f"accepted {accepted} of {len(self.spec)} speculative tokens")
        keep = min(self.cached, len(self.committed) + int(accepted))
        self.committed += self.spec[: int(accepted)] + [int(token)]
        self.spec = []
        self.cached = keep
        return keep

    def reset(self) -> int:
        """Drop the speculative tokens; returns the cache length to keep."""
        self.spec = []
        self.cached = min(self.cached, len(self.committed))
        return self.cached

    def feed_start(self, rows: int) -> int:
        """Where feeding must start so the last ``rows`` fed positions are all new.

        A row comes out of the forward of its *conditioning* token, so the last
        ``rows`` tokens must not be cached yet; roll back further if they are.
        """
        return min(self.cached, len(self.committed) + len(self.spec) - rows)
