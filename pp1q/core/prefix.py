"""A committed token prefix with its running digest (STEP.prefix_digest).

Both daemons keep one per slot: the verifier from what it committed, the worker from
the context it was given plus every COMMIT. The digest in each STEP lets the worker
prove, before drafting, that it drafts after the same prefix the verifier will verify.

digest = xxh3_64 over the prefix as little-endian int32 ids, computed incrementally.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import xxhash

PREFIX_DIGEST_ID = "xxh3_64(int32-le ids)"


class Prefix:
    """Append-only token list with an O(delta) digest."""

    __slots__ = ("tokens", "_hash")

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self.tokens: list[int] = []
        self._hash = xxhash.xxh3_64()
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        new = [int(t) for t in tokens]
        if new:
            self._hash.update(np.asarray(new, dtype="<i4").tobytes())
            self.tokens.extend(new)

    def copy(self) -> Prefix:
        other = Prefix.__new__(Prefix)
        other.tokens = list(self.tokens)
        other._hash = self._hash.copy()
        return other

    @property
    def digest(self) -> int:
        return self._hash.intdigest()

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def last_position(self) -> int:
        """Absolute position of the last committed token (positions count from 0)."""
        return len(self.tokens) - 1


def digest_of(tokens: Iterable[int]) -> int:
    return Prefix(tokens).digest
