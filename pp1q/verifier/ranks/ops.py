"""Rank ops: what rank 0 tells every verifier rank, as bytes (sans-IO).

Ranks meet in *exchanges* (docs/operations.md, "Ranks"). In each, rank 0 broadcasts a
batch of ops, at most one per slot, in an envelope of ENVELOPE_BYTES; a longer batch
sends its tail in one overflow broadcast whose length the envelope declares (checked
against the bound before a byte of it is received). Every rank checks every op against
its replica of the committed state and votes; the op's decider adds its decision to
its vote. Votes are summed across ranks, each rank filling only its own row, so the sum
holds every rank's row, and every rank derives the same verdicts from it: an op commits
on every rank when every rank voted yes, otherwise every rank discards it.

This module turns ops into bytes and bytes into ops (``RemoteProtocolError`` for
anything malformed); pp1q.verifier.ranks.votes turns votes into verdicts,
pp1q.verifier.ranks.collective moves the bytes, pp1q.verifier.ranks.replica checks and
applies the ops.

Envelope head, 40 bytes LE: magic ``PP1QRANK``, version u16, op count u16, flags u32,
exchange sequence u64, body length u32, overflow length u32, xxh3_64 of head bytes 0..31
followed by the body. Body: per op a 52-byte head (``_OP``) and its payload: OPEN the
prompt (int32 ids) then the request's target processors (``_PROCESSORS``: temperature
FP64, exactly the float the HTTP API decoded, 1 for greedy requests; top-k u32, 0 for
none; top-p FP64, 1 for none), so every rank knows the p it decides from; ROUND the
draft ids (int32), a row table (form, entries: u32 pairs) and the rows exactly as the
worker sent them (dense FP32 q, or sparse int32 ids then FP32 q; a SHARDED row, --shard-
vocab's dense row, has no bytes here: rank 0 scatters its slices after the envelope,
pp1q.verifier.ranks.sharded); PREFILL the prompt length whose K/V the slot's target
cache is brought up to (u32: the next chunk boundary, below the prompt's length); the
other kinds nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from dataclasses import dataclass

import numpy as np
import xxhash

from pp1q.core.errors import DistributionError, Reason, RemoteProtocolError
from pp1q.core.q import DyadicRow
from pp1q.models.processors import Processors
from pp1q.verifier.api import MAX_TEMPERATURE  # an OPEN's temperature: what the API takes

MAGIC = b"PP1QRANK"
VERSION = 3  # 2: OPEN carries the target processors (--shard-vocab samples at T);
# 3: PREFILL (a sharded real model's prompt prefilled a chunk per op)
ENVELOPE_BYTES = 16 * 1024  # gloo's broadcast costs the same from 128 B to ~64 KiB on
# loopback; 16 KiB holds four sparse k=32 rounds, so overflow broadcasts are for dense rows
MAX_PROMPT_TOKENS = 65536  # as the HTTP API (pp1q.verifier.api): bounds an OPEN payload
MAX_BATCH_OPS = 64  # one op per slot, and the verifier has at most 64 slots

_HEAD = struct.Struct("<8sHHIQIIQ")
_OP = struct.Struct("<BBHHHHHIIIIQQII")
_ROW = struct.Struct("<II")  # form, entries
_PROCESSORS = struct.Struct("<dId")  # OPEN, after the prompt: temperature, top-k, top-p
_PREFILL = struct.Struct("<I")  # PREFILL: the prompt length the slot's K/V reach
_CHECKED = _HEAD.size - 8  # the checksum covers the head up to itself, then the body
HEAD_BYTES = _HEAD.size

REASONS = tuple(Reason)  # op and vote reason words index this (same pp1q version on every rank)
FLAG_STOP = 1  # envelope flag: the group stops after this exchange
FLAG_GREEDY = 1  # op flag: OPEN of a greedy request; ROUND of a token-only proposal


class OpKind(enum.IntEnum):
    OPEN = 1  # a request takes the slot: prompt, seed, greedy
    ROUND = 2  # verify a validated proposal: drafts and q rows; the decider decides
    TARGET_ONLY = 3  # one target-only token (requested, or a fallback); the decider draws
    INVALIDATE = 4  # the slot's generation is dead: no proposal of it is verified again
    CLOSE = 5  # the request released the slot
    PREFILL = 6  # every rank brings the slot's target K/V up to prompt[:upto] (one chunk)


class Form(enum.IntEnum):
    DENSE = 1  # as pp1q.wire.Form
    SPARSE = 2
    SHARDED = 3  # a dense row scattered by vocabulary slices after the envelope (--shard-vocab)


@dataclass(frozen=True)
class Limits:
    """Bounds every rank checks before touching a payload (from the verifier's settings)."""

    world: int
    slots: int
    depth: int
    vocab: int
    dense_len: int  # FP32 entries of a dense row (pp1q.wire.Limits.dense_len)
    max_support: int
    sharded: bool = False  # --shard-vocab: dense rows travel as SHARDED (no payload)

    @property
    def max_payload(self) -> int:
        """The largest single op payload: a ROUND of dense rows, or a longest prompt."""
        row = max(self.dense_len * 4, self.max_support * 8)
        return max(self.depth * (4 + _ROW.size + row), MAX_PROMPT_TOKENS * 4 + _PROCESSORS.size)

    @property
    def max_body(self) -> int:
        return self.slots * (_OP.size + self.max_payload)


@dataclass(frozen=True, eq=False)
class Op:
    """One op. ``prefix_len``/``prefix_digest``: rank 0's committed state of the slot
    before the op, which every rank compares with its own. Arrays decoded from bytes
    are read-only views of the exchange buffer, valid until the next exchange."""

    kind: OpKind
    slot: int
    generation: int = 0
    round_id: int = 0
    decider: int = 0
    greedy: bool = False
    seed: int = 0
    prefix_len: int = 0
    prefix_digest: int = 0
    reason: Reason | None = None  # INVALIDATE: why
    prompt: np.ndarray | None = None  # OPEN: int32 ids
    drafts: np.ndarray | None = None  # ROUND: int32 ids
    rows: tuple = ()  # ROUND sampled: (form, ids or None, q) per draft, wire bytes
    q_rows: tuple[DyadicRow, ...] | None = None  # rank 0 only: the rows it validated
    processors: Processors = Processors()  # OPEN: the request's target processors
    upto: int = 0  # PREFILL: the K/V of prompt[:upto] (1 <= upto < prefix_len)

    def payload_parts(self) -> list:
        if self.kind is OpKind.OPEN:
            p = self.processors
            return [_le(self.prompt, "<i4"), _PROCESSORS.pack(
                p.temperature, p.top_k or 0, 1.0 if p.top_p is None else p.top_p)]
        if self.kind is OpKind.PREFILL:
            return [_PREFILL.pack(self.upto)]
        if self.kind is not OpKind.ROUND:
            return []
        parts = [_le(self.drafts, "<i4")]
        parts += [_ROW.pack(form, 0 if form == Form.SHARDED else int(np.asarray(q).size))
                  for form, _ids, q in self.rows]
        for form, ids, q in self.rows:
            if form == Form.SPARSE:
                parts.append(_le(ids, "<i4"))
            if form != Form.SHARDED:
                parts.append(_le(q, "<f4"))
        return parts


def _le(arr, dtype: str) -> memoryview:
    a = np.ascontiguousarray(arr, dtype=dtype)
    return memoryview(a).cast("B")


# ---------------------------------------------------------------------------
# encoding (rank 0)


def pack(seq: int, ops: list[Op], flags: int, envelope: np.ndarray,
         overflow: np.ndarray) -> int:
    """Write the batch into ``envelope`` (and ``overflow``); returns the overflow length."""
    body = []
    for op in ops:
        parts = op.payload_parts()
        n = sum(len(p) for p in parts)
        n_rows = len(op.rows)
        drafts = 0 if op.drafts is None else int(np.asarray(op.drafts).size)
        reason = 0 if op.reason is None else REASONS.index(Reason(op.reason)) + 1
        body.append(_OP.pack(op.kind, FLAG_GREEDY if op.greedy else 0, op.decider, drafts,
                             n_rows, reason, 0, op.slot, op.generation, op.round_id,
                             op.prefix_len, op.prefix_digest, op.seed, n, 0))
        body += parts
    body_len = sum(len(p) for p in body)
    room = ENVELOPE_BYTES - _HEAD.size
    over = max(0, body_len - room)
    if over > overflow.size:
        raise ValueError(f"batch of {body_len} bytes exceeds the exchange buffers")
    h = xxhash.xxh3_64()
    head = _HEAD.pack(MAGIC, VERSION, len(ops), flags, seq, body_len, over, 0)
    h.update(head[:_CHECKED])
    at, target, end = _HEAD.size, envelope, ENVELOPE_BYTES
    for part in body:
        mv = memoryview(part).cast("B")
        h.update(mv)
        while len(mv):
            if at == end:  # the envelope is full: the rest goes to the overflow buffer
                target, at, end = overflow, 0, over
            n = min(len(mv), end - at)
            target[at:at + n] = np.frombuffer(mv[:n], dtype=np.uint8)
            at += n
            mv = mv[n:]
    envelope[:_HEAD.size] = np.frombuffer(
        _HEAD.pack(MAGIC, VERSION, len(ops), flags, seq, body_len, over, h.intdigest()),
        dtype=np.uint8)
    return over


# ---------------------------------------------------------------------------
# decoding (every rank but 0)


@dataclass(frozen=True)
class Head:
    n_ops: int
    flags: int
    seq: int
    body_len: int
    overflow_len: int
    checksum: int


def read_head(envelope: np.ndarray, limits: Limits) -> Head:
    """The envelope's head, every length checked against ``limits`` before use."""
    magic, version, n_ops, flags, seq, body_len, over, checksum = _HEAD.unpack_from(
        envelope.data)
    if magic != MAGIC:
        raise RemoteProtocolError(Reason.BAD_MAGIC, "rank envelope magic")
    if version != VERSION:
        raise RemoteProtocolError(Reason.BAD_VERSION, f"rank envelope version {version}")
    if flags & ~FLAG_STOP:
        raise RemoteProtocolError(Reason.BAD_FLAGS, f"rank envelope flags {flags:#x}")
    if n_ops > min(limits.slots, MAX_BATCH_OPS):
        raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, f"{n_ops} ops in one exchange")
    if body_len > limits.max_body:
        raise RemoteProtocolError(Reason.FRAME_TOO_LARGE, f"rank body of {body_len} bytes")
    if over != max(0, body_len - (ENVELOPE_BYTES - _HEAD.size)):
        raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, "rank overflow length")
    return Head(n_ops, flags, seq, body_len, over, checksum)


def body_of(head: Head, envelope: np.ndarray, overflow: np.ndarray) -> bytes:
    """The whole body (one copy), its checksum verified."""
    inline = envelope[_HEAD.size:_HEAD.size + head.body_len - head.overflow_len]
    h = xxhash.xxh3_64(bytes(envelope[:_CHECKED]))
    body = inline.tobytes() + overflow[:head.overflow_len].tobytes()
    h.update(body)
    if h.intdigest() != head.checksum:
        raise RemoteProtocolError(Reason.CHECKSUM_MISMATCH, "rank envelope checksum")
    return body


def decode(head: Head, body: bytes, limits: Limits) -> list[Op]:
    ops, at, slots = [], 0, set()
    for _ in range(head.n_ops):
        if at + _OP.size > len(body):
            raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, "rank op head past the body")
        (kind, flags, decider, n_drafts, n_rows, reason, pad0, slot, generation, round_id,
         prefix_len, digest, seed, n, pad1) = _OP.unpack_from(body, at)
        at += _OP.size
        if pad0 or pad1 or flags & ~FLAG_GREEDY:
            raise RemoteProtocolError(Reason.BAD_FLAGS, "rank op flags or padding")
        try:
            kind = OpKind(kind)
        except ValueError:
            raise RemoteProtocolError(Reason.UNKNOWN_MESSAGE_TYPE, f"rank op {kind}") from None
        if slot >= limits.slots or slot in slots:
            raise RemoteProtocolError(Reason.SLOT_OUT_OF_RANGE, f"rank op slot {slot}")
        slots.add(slot)
        if decider >= limits.world:
            raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, f"decider {decider}")
        if reason > len(REASONS) or (reason != 0) != (kind is OpKind.INVALIDATE):
            raise RemoteProtocolError(Reason.MALFORMED_CONTROL, "rank op reason")
        if n > limits.max_payload or at + n > len(body):
            raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, f"rank op payload {n}")
        payload = memoryview(body)[at:at + n]
        at += n
        op = Op(kind, slot, generation, round_id, decider, bool(flags & FLAG_GREEDY), seed,
                prefix_len, digest, REASONS[reason - 1] if reason else None)
        ops.append(_with_payload(op, n_drafts, n_rows, payload, limits))
    if at != len(body):
        raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, "bytes after the last rank op")
    return ops


def _with_payload(op: Op, n_drafts: int, n_rows: int, payload: memoryview,
                  limits: Limits) -> Op:
    if op.kind is OpKind.OPEN:
        if n_drafts or n_rows or not 1 <= op.prefix_len <= MAX_PROMPT_TOKENS \
                or len(payload) != 4 * op.prefix_len + _PROCESSORS.size:
            raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, "OPEN payload")
        prompt = _ids(payload, op.prefix_len, limits.vocab)
        return _replace(op, prompt=prompt, processors=_processors(payload, 4 * op.prefix_len))
    if op.kind is OpKind.PREFILL:
        # right after its OPEN: a prompt's length, and never its last id (the first
        # round feeds that one with the drafts)
        if n_drafts or n_rows or len(payload) != _PREFILL.size \
                or not 1 < op.prefix_len <= MAX_PROMPT_TOKENS:
            raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, "PREFILL payload")
        (upto,) = _PREFILL.unpack_from(payload)
        if not 1 <= upto < op.prefix_len:
            raise RemoteProtocolError(Reason.BAD_POSITION, f"PREFILL up to {upto}")
        return _replace(op, upto=upto)
    if op.kind is not OpKind.ROUND:
        if n_drafts or n_rows or len(payload):
            raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, f"{op.kind.name} payload")
        return op
    if not 1 <= n_drafts <= limits.depth or n_rows != (0 if op.greedy else n_drafts):
        raise RemoteProtocolError(Reason.DEPTH_TOO_LARGE, f"ROUND of {n_drafts} drafts")
    drafts = _ids(payload, n_drafts, limits.vocab)
    at = 4 * n_drafts
    table_end = at + _ROW.size * n_rows
    if table_end > len(payload):
        raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, "ROUND row table")
    rows = []
    for i in range(n_rows):
        form, entries = _ROW.unpack_from(payload, at + i * _ROW.size)
        if form == Form.DENSE and entries == limits.dense_len:
            size = 4 * entries
        elif form == Form.SPARSE and 1 <= entries <= limits.max_support:
            size = 8 * entries
        elif form == Form.SHARDED and entries == 0 and limits.sharded:
            rows.append((Form.SHARDED, None, None))
            continue
        else:
            raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, f"ROUND row {form}/{entries}")
        if table_end + size > len(payload):
            raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, "ROUND row past the payload")
        raw = payload[table_end:table_end + size]
        table_end += size
        if form == Form.SPARSE:
            rows.append((Form.SPARSE, np.frombuffer(raw[:4 * entries], "<i4"),
                         np.frombuffer(raw[4 * entries:], "<f4")))
        else:
            rows.append((Form.DENSE, None, np.frombuffer(raw, "<f4")))
    if table_end != len(payload):
        raise RemoteProtocolError(Reason.UNEXPECTED_SIZE, "bytes after the ROUND rows")
    return _replace(op, drafts=drafts, rows=tuple(rows))


def _processors(payload: memoryview, at: int) -> Processors:
    temperature, top_k, top_p = _PROCESSORS.unpack_from(payload, at)
    if not 0.0 < temperature <= MAX_TEMPERATURE:  # NaN fails this too
        raise RemoteProtocolError(Reason.BAD_TEMPERATURE, f"OPEN temperature {temperature!r}")
    try:  # the same checks as the API's (top_p in (0, 1], top_k >= 1)
        return Processors(temperature, top_k or None, None if top_p == 1.0 else top_p)
    except DistributionError as e:
        raise RemoteProtocolError(e.reason, f"OPEN processors: {e.detail}") from None


def _ids(payload: memoryview, n: int, vocab: int) -> np.ndarray:
    ids = np.frombuffer(payload[:4 * n], "<i4")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise RemoteProtocolError(Reason.ID_OUT_OF_RANGE, "token id outside the vocabulary")
    return ids


def _replace(op: Op, **fields) -> Op:
    return dataclasses.replace(op, **fields)
