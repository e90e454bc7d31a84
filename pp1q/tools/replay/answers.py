"""A worker's answer frame, summarised for comparison, and how two of them differ.

``pp1q replay FILE --worker HOST:PORT`` compares the frames a live worker sends with the
ones the capture holds. A frame is kept as an ``Answer``: its control fields, the
payload checksum its header claims, whether its payload checked, and per drafted
position the token, the q of that token (in 2^-24 units) and a digest of the row's ids
and q bytes. Nothing else of a frame can differ once it decodes (the header's other
fields are fixed or checked by the decoder), so equal summaries mean equal frames, and
a summary is a few hundred bytes where a dense row is half a megabyte: a capture of
many rounds is compared without holding its rows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import msgspec
import numpy as np
import xxhash

from pp1q.core.errors import Reason
from pp1q.core.q import MASS
from pp1q.wire import Proposal, Refusal, Reply, Status
from pp1q.wire.framing import Frame
from pp1q.wire.messages import CONNECTION_SLOT, HEAD_CLASSES, type_of

HANDSHAKE = None  # the key of a connection's own answers (HELLO_ANSWER, its REFUSAL)


@dataclass(frozen=True, slots=True)
class Row:
    """One drafted position of an answer."""

    position: int
    token: int
    q_count: int | None  # q of the token times 2^24; None: no q (greedy, or payload bad)
    digest: int | None  # xxh3_64 of the row's ids and q bytes; None without a payload


@dataclass(frozen=True, slots=True)
class Answer:
    """One worker -> verifier frame, as compared (see the module docstring)."""

    kind: str  # the MsgType name
    key: tuple[int, int, int] | None  # (slot, generation, round); HANDSHAKE for the session's
    fields: tuple[tuple[str, object], ...]  # the control part, arrays left out
    checksum: int  # the payload checksum the header claims
    error: str | None  # why the payload did not check (its Reason value), else None
    rows: tuple[Row, ...] = ()

    @property
    def terminal(self) -> bool:
        """The last frame of a step's answer (COMPLETION, PROPOSAL, the step's REFUSAL)."""
        return self.kind in ("COMPLETION", "PROPOSAL", "REFUSAL") and self.key is not HANDSHAKE

    @property
    def refused_session(self) -> bool:
        return self.kind == "REFUSAL" and self.key is HANDSHAKE

    def field(self, name: str):
        return dict(self.fields).get(name)

    def label(self) -> str:
        """``REPLY #3``, ``COMPLETION aborted(drafter_failed)``, ``PROPOSAL``..."""
        if self.kind == "REPLY":
            return f"REPLY #{self.field('index')}"
        if self.kind == "COMPLETION" and self.field("status") != Status.OK:
            return f"COMPLETION aborted({self.field('reason')})"
        if self.kind == "REFUSAL":
            return f"REFUSAL({self.field('reason')})"
        return self.kind


def answer_of(frame: Frame) -> Answer:
    """The summary of a decoded worker frame. Call it while the frame's arrays are still
    valid (a decoder may reuse its payload buffers for the next frame)."""
    m = frame.message
    t = type_of(m)
    head = HEAD_CLASSES.get(t)
    names = head.__struct_fields__ if head is not None else m.__struct_fields__
    fields = tuple((n, _plain(getattr(m, n))) for n in names)
    key = HANDSHAKE
    if hasattr(m, "round_id") and not (isinstance(m, Refusal) and m.slot == CONNECTION_SLOT):
        key = (m.slot, m.generation, m.round_id)
    error = frame.error.reason.value if frame.error is not None else None
    return Answer(t.name, key, fields, frame.payload_checksum, error, _rows(m))


def _plain(value):
    """Control values as comparable builtins: lists as tuples, nested structs as dicts by
    field name (``Limits`` is array-like on the wire: by position it would read as an
    unnamed tuple in a divergence)."""
    if isinstance(value, msgspec.Struct):
        return {name: _plain(getattr(value, name)) for name in value.__struct_fields__}
    value = msgspec.to_builtins(value)
    return tuple(value) if isinstance(value, list) else value


def _rows(m) -> tuple[Row, ...]:
    if isinstance(m, Reply):
        return (_row(m.position, m.token, m.ids, m.q),)
    if isinstance(m, Proposal):
        n = len(m.tokens)
        ids = m.ids if m.ids is not None else (None,) * n
        qs = m.q if m.q is not None else (None,) * n
        return tuple(_row(m.first_position + i, m.tokens[i], ids[i], qs[i]) for i in range(n))
    return ()


def _row(position: int, token: int, ids, q) -> Row:
    if q is None:  # greedy (token only), or the payload failed its checksum and was dropped
        return Row(position, int(token), None, None)
    h = xxhash.xxh3_64()
    if ids is not None:
        h.update(np.ascontiguousarray(ids).tobytes())
    h.update(np.ascontiguousarray(q).tobytes())
    return Row(position, int(token), _q_count(token, ids, q), h.intdigest())


def _q_count(token: int, ids, q) -> int | None:
    """q of ``token`` in 2^-24 units (q values are dyadic: exact in FP32), None when the
    row does not hold it."""
    if ids is None:
        return int(q[token] * MASS) if 0 <= token < len(q) else None
    at = int(np.searchsorted(ids, token))
    return int(q[at] * MASS) if at < len(ids) and ids[at] == token else None


def corrupted_on_the_way(captured: Answer, live: Answer) -> bool:
    """A captured frame whose payload failed its checksum where the live one's checks:
    in a capture made after a network (a verifier's), the network's doing (a chaos
    run's bit flip), not the captured worker's."""
    return captured.error == Reason.CHECKSUM_MISMATCH.value and live.error is None


def difference(captured: Answer, live: Answer, *, network: bool = False
               ) -> tuple[int | None, str] | None:
    """None when the frames are the same; else (position or None, what differs), the
    first difference in the order a reader wants it: kind, tokens, payload, fields.
    ``network``: the capture recorded the worker's frames after a network; a captured
    payload corrupted on the way (``corrupted_on_the_way``) is then compared by all the
    rest, its payload by the checksum its header claims (the worker's, intact: the
    header and the control part have checksums of their own) against the live one's."""
    if captured == live:
        return None
    if network and corrupted_on_the_way(captured, live):
        live = dataclasses.replace(live, error=captured.error, rows=tuple(
            Row(r.position, r.token, None, None) for r in live.rows))  # as a lost payload
        if captured == live:
            return None
    if captured.kind != live.kind:
        return None, f"captured {captured.label()}, live {live.label()}"
    for c, v in zip(captured.rows, live.rows, strict=False):
        if c.position != v.position:
            return c.position, f"captured position {c.position}, live {v.position}"
        if c.token != v.token:
            return c.position, f"token: captured {c.token}, live {v.token}"
    if len(captured.rows) != len(live.rows):
        return None, f"{len(captured.rows)} positions captured, {len(live.rows)} live"
    if captured.error != live.error:
        which, why = (("captured", captured.error) if captured.error is not None
                      else ("live", live.error))
        return None, f"the {which} {captured.label()}'s payload fails its check ({why})"
    for c, v in zip(captured.rows, live.rows, strict=True):
        if c.digest != v.digest:
            return c.position, (f"q row (token {c.token}): captured q={_q(c)}, live q={_q(v)}"
                                + ("" if c.q_count != v.q_count
                                   else "; the token's q is equal, other entries differ"))
    for (name, c), (_, v) in zip(captured.fields, live.fields, strict=True):
        if c != v:
            return None, f"{captured.label()} {name}: {_differing(c, v)}"
    return None, (f"{captured.label()} payload checksum: captured {captured.checksum:016x}, "
                  f"live {live.checksum:016x}")


def _differing(c, v) -> str:
    """A control field's two values; of a struct (HELLO_ANSWER's limits, identity), the
    members that differ, by name."""
    if not (isinstance(c, dict) and isinstance(v, dict)):
        return f"captured {c!r}, live {v!r}"
    return "; ".join(f"{k} captured {c[k]!r}, live {v.get(k)!r}" for k in c if c[k] != v.get(k))


def _q(row: Row) -> str:
    return "none" if row.q_count is None else f"{row.q_count}/2^24"


__all__ = ["HANDSHAKE", "Answer", "Row", "answer_of", "difference"]
