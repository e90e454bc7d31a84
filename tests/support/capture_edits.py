"""Captures cut and spliced for the replay tests: records re-chunked, a connection's
streams read out whole or frame by frame, bytes recorded into a stream (a copy of a
frame, garbage) with every other byte where it was, the other side's capture of the
same bytes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from pp1q.runtime.capture import Direction, Kind, Role
from pp1q.tools.replay.streams import Flow, flow_of
from pp1q.wire import read_header


def worker_streams(role: Role, records: Iterable) -> dict[int, bytes]:
    """Each connection's worker -> verifier bytes, as captured."""
    out: dict[int, bytearray] = {}
    for r in records:
        if r.kind is Kind.DATA and flow_of(role, r.direction) is Flow.TO_VERIFIER:
            out.setdefault(r.conn, bytearray()).extend(r.body)
    return {conn: bytes(b) for conn, b in out.items()}


def frames(stream: bytes) -> list[bytes]:
    """A stream of whole wire frames, split frame by frame."""
    out, at = [], 0
    while at < len(stream):
        n = read_header(stream, at).frame_bytes
        out.append(stream[at:at + n])
        at += n
    return out


def rechunk(records: Iterable, size: int) -> list:
    """The same capture with every DATA body cut into records of ``size`` bytes."""
    out = []
    for r in records:
        if r.kind is not Kind.DATA:
            out.append(r)
            continue
        for k in range(0, len(r.body), size):
            out.append(dataclasses.replace(r, body=r.body[k:k + size]))
    return out


def recorded_by(role: Role, capture_role: Role, records: Iterable) -> list:
    """``records`` (a capture ``capture_role``'s process took) as ``role``'s would have
    recorded the same bytes: where the roles differ, what one sent the other received."""
    if role is capture_role:
        return list(records)
    other = {Direction.IN: Direction.OUT, Direction.OUT: Direction.IN}
    return [dataclasses.replace(r, direction=other[r.direction]) if r.kind is Kind.DATA
            else r for r in records]


def spliced(role: Role, records: Iterable, conn: int, flow: Flow, at: int,
            data: bytes, *, joins: str = "next") -> list:
    """The capture with ``data`` recorded inside ``conn``'s ``flow`` stream at byte
    ``at`` (a frame copied, garbage); every other byte where it was. Where a record ends
    at ``at``, ``joins`` says which gets it: the "next" (recorded with what follows) or
    the "previous" (with what came before: a copy delivered with its original)."""
    out, seen, last = [], 0, None
    for r in records:
        if r.kind is Kind.DATA and r.conn == conn and flow_of(role, r.direction) is flow:
            start, seen, last = seen, seen + len(r.body), len(out)
            held = start < at <= seen if joins == "previous" else start <= at < seen
            if data and held:
                k = at - start
                r = dataclasses.replace(r, body=r.body[:k] + data + r.body[k:])
                data = b""
        out.append(r)
    if data and at == seen and last is not None:
        out[last] = dataclasses.replace(out[last], body=out[last].body + data)
    return out


__all__ = ["frames", "rechunk", "recorded_by", "spliced", "worker_streams"]
