"""A drafted row written as a REPLY: ``reply_from_row`` builds the Reply that carries a
q row exactly (sparse: its ids and q; dense: q for every entry, padded with zeros to
``dense_len``; token-only: no q), refusing a token the row could not have drawn. The
worker's direct path (``WorkerEndpoint.send_row``) writes the same bytes without
building one; a PROPOSAL's rows: pp1q.wire.proposal.
"""

from __future__ import annotations

import numpy as np

from pp1q.core.errors import LocalProtocolError, Reason, RowValidationError
from pp1q.core.q import MASS, DyadicRow
from pp1q.wire.messages import Form, Reply
from pp1q.wire.pool import ZeroRow


def require_own_token(row: DyadicRow, token: int) -> int:
    """``row.require_token(token)`` on the sending side: a token our own q could not have
    drawn is our bug (LocalProtocolError), where a received one is the peer's (the row's
    RowValidationError, a RemoteProtocolError). Never ship such a token."""
    try:
        return row.require_token(token)
    except RowValidationError as e:
        raise LocalProtocolError(e.reason, e.detail) from None


def reply_from_row(
    *,
    session: int,
    slot: int,
    generation: int,
    round_id: int,
    index: int,
    position: int,
    token: int,
    row: DyadicRow | None,
    form: Form,
    dense_len: int | None = None,
    dense_row: ZeroRow | None = None,
) -> Reply:
    """Build a REPLY carrying ``row`` exactly (dense padded with zeros to ``dense_len``).

    ``dense_row``: a reused zero row for the dense q (pp1q.wire.pool.ZeroRow); the REPLY
    then reads it, so encode it before the next build with the same ``dense_row``.
    """
    form = Form(form)
    head = dict(session=session, slot=slot, generation=generation, round_id=round_id,
                index=index, position=position, token=token, form=int(form))
    if form is Form.TOKEN_ONLY:
        if row is not None:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, "token-only reply given a q row")
        return Reply(**head, entries=0)
    if row is None:
        raise LocalProtocolError(Reason.MISSING_Q, "sampled reply without its q row")
    require_own_token(row, token)
    if form is Form.DENSE:
        n = row.vocab if dense_len is None else dense_len
        if n < row.vocab:
            raise LocalProtocolError(Reason.UNEXPECTED_SIZE, f"dense_len {n} < vocab")
        if dense_row is not None:
            return Reply(**head, entries=n, q=dense_row.fill(n, row))
        q = np.zeros(n, dtype="<f4")
        q[row.ids] = row.counts.astype(np.float32) / np.float32(MASS)
        return Reply(**head, entries=n, q=q)
    ids, q = row.to_sparse()
    return Reply(**head, entries=int(ids.size), ids=ids.astype("<i4"), q=q.astype("<f4"))
