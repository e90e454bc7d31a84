"""A PROPOSAL's payload (wire v2 revision 3): a sparse step's rows in one buffer.

The worker packs its DyadicRows straight into the payload (``pack_rows``: one kernel
call a row writes the ids, the q and checks the proposed token); the verifier views
each row where it lies (``row_views``) and checks every row in one kernel call
(pp1q.core.q_parse.parse_sparse_rows). One frame a step instead of a REPLY a row and a
COMPLETION: the per-frame work was most of a sparse round (BENCHMARKS.md).
"""

from __future__ import annotations

import numpy as np
import xxhash

from pp1q.core import q_backend
from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.q import MASS
from pp1q.wire.messages import Proposal
from pp1q.wire.reply_rows import require_own_token

_I4, _F4 = np.dtype("<i4"), np.dtype("<f4")
_MASS_F32 = np.float32(MASS)
_xxh3 = xxhash.xxh3_64_intdigest


def row_checksum(ids, q) -> int:
    """A sparse row's probability checksum: xxh3_64 of its ids then its q, LE (what
    the payload_xxh3 of a REPLY carrying that row is)."""
    return _xxh3(b"".join((ids, q)))


def pack_rows(tokens, rows) -> tuple[np.ndarray, list[int], list[int]]:
    """(words, entries, row_checksums) of a proposal: the payload as LE int32 words (each
    row its ids, then its FP32 q's bits), each row's entry count and checksum. A token
    its own row cannot draw is refused (``reply_rows.require_own_token``: local)."""
    if len(tokens) != len(rows):
        raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "tokens and rows differ in number")
    for row in rows:
        if row is None:
            raise LocalProtocolError(Reason.MISSING_Q, "sampled proposal without its q row")
    entries = [int(row.ids.size) for row in rows]
    words = np.empty(2 * sum(entries), dtype=_I4)
    q_words = words.view(_F4)
    payload = memoryview(words).cast("B")
    k = q_backend.kernels_for(words)  # None on a big-endian host: LE words are not native
    sums, at = [], 0
    for token, row, n in zip(tokens, rows, entries, strict=True):
        ids, q = words[at:at + n], q_words[at + n:at + 2 * n]
        if k is not None and 0 <= token < row.vocab:
            found = k.pack_sparse(row.ids, row.counts, token, ids, q)
        else:  # numpy: the same bits (count / 2^24 is exact in FP32)
            ids[:] = row.ids
            q[:] = row.counts.astype(np.float32) / _MASS_F32
            found = row.count_of(token) > 0
        if not found:
            require_own_token(row, token)  # raises the refusal with its reason
        sums.append(_xxh3(payload[4 * at:4 * (at + 2 * n)]))
        at += 2 * n
    words.flags.writeable = False
    return words, entries, sums


def row_views(words: np.ndarray, entries) -> tuple[tuple, tuple]:
    """(ids, q): each row's int32 ids and FP32 q, viewed in the payload ``words``."""
    q_words = words.view(_F4)
    ids, q, at = [], [], 0
    for n in entries:
        ids.append(words[at:at + n])
        q.append(q_words[at + n:at + 2 * n])
        at += 2 * n
    return tuple(ids), tuple(q)


def proposal_from_rows(*, session: int, slot: int, generation: int, round_id: int,
                       first_position: int, context_version: int, tokens, rows) -> Proposal:
    """A PROPOSAL carrying each ``rows[i]`` exactly (sparse) for ``tokens[i]``."""
    tokens = [int(t) for t in tokens]
    words, entries, sums = pack_rows(tokens, rows)
    ids, q = row_views(words, entries)
    return Proposal(session=session, slot=slot, generation=generation, round_id=round_id,
                    first_position=first_position, context_version=context_version,
                    tokens=tokens, entries=entries, row_checksums=sums, ids=ids, q=q)
