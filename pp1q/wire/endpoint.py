"""What both sans-IO endpoints share: configuration, handshake state, decoding loop.

No sockets, no clocks of their own: callers feed received bytes with ``now`` and
write the bytes ``send()`` (and ``data_to_send()``) return. h11 and aioquic are the
models: explicit state tables, two error classes, time passed in.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from pp1q.core.errors import LocalProtocolError, Reason, RemoteProtocolError
from pp1q.core.prefix import Prefix
from pp1q.wire.decoder import FrameDecoder
from pp1q.wire.framing import Frame
from pp1q.wire.limits import Limits
from pp1q.wire.messages import KNOWN_VERSIONS, Identity
from pp1q.wire.pool import PayloadPool
from pp1q.wire.table import (
    Conn,
    Pseudo,
    Role,
    SlotState,
    check_receiving,
    check_usable,
    conn_event,
    receivable,
)


@dataclass(frozen=True)
class WireConfig:
    """One side's configuration. ``versions`` has no default on purpose: v2 (sampled
    steps with q) is enabled only by listing it explicitly, never by default."""

    identity: Identity
    limits: Limits
    versions: tuple[int, ...]

    def __post_init__(self) -> None:
        versions = tuple(self.versions)
        # empty: speculation off (a worker refuses every HELLO; a verifier never dials)
        if any(v not in KNOWN_VERSIONS for v in versions):
            raise LocalProtocolError(Reason.BAD_VERSION, f"versions {versions!r}")
        object.__setattr__(self, "versions", versions)
        self.limits.check(self.identity.vocab, LocalProtocolError)


@dataclass
class SlotTrack:
    """Per-slot bookkeeping (the slot machine's state plus what its checks need)."""

    state: SlotState = SlotState.IDLE
    generation: int = -1  # of the last STEP
    round_id: int = -1  # of the last STEP
    dead_upto: int = -1  # every generation <= this is invalidated
    committed: int | None = None  # position of the last committed token (same generation)
    step: object = None  # the outstanding Step
    frames: list = field(default_factory=list)  # REPLY frames of the outstanding step
    rows: list = field(default_factory=list)  # validated rows (verifier)
    reply_bytes: int = 0
    checksums: list = field(default_factory=list)  # payload checksums, in index order
    deadline: float | None = None
    # worker: the committed context (CONTEXT, then every COMMIT) and this round's drafts.
    # It survives a RESET of a discarded proposal and new generations; only a RESET
    # ``cancelled`` (the request ended), a refused CONTEXT, a COMMIT past max_context or
    # a new connection drop it.
    prefix: Prefix | None = None
    drafts: list = field(default_factory=list)
    context_error: RemoteProtocolError | None = None  # why the context is gone: next STEP's

    def begin(self, step) -> None:
        if step.generation != self.generation:  # a new generation retires every older one
            self.dead_upto = max(self.dead_upto, step.generation - 1)
            self.committed = None
        self.generation, self.round_id, self.step = step.generation, step.round_id, step
        self.frames, self.rows, self.checksums, self.drafts = [], [], [], []
        self.reply_bytes = 0
        self.deadline = None

    def invalidate(self, generation: int) -> None:
        self.dead_upto = max(self.dead_upto, generation)
        self.deadline = None
        if self.generation <= self.dead_upto:
            self.committed = None

    def is_dead(self, generation: int) -> bool:
        return generation <= self.dead_upto

    def check_keys(self, step, err: type) -> None:
        """A STEP's RNG keys (seed, generation, round, position) are never reused:
        generations never go back, rounds strictly increase, and the next step of a
        generation starts at its last commit."""
        if self.is_dead(step.generation) or step.generation < self.generation:
            raise err(Reason.STALE_GENERATION, f"generation {step.generation}")
        if step.generation == self.generation:
            if step.round_id <= self.round_id:
                raise err(Reason.DUPLICATE_ROUND, f"round {step.round_id}")
            if self.committed is not None and step.last_committed != self.committed:
                raise err(Reason.BAD_POSITION, "last_committed is not the last commit")


class Endpoint:
    role: Role

    def __init__(self, config: WireConfig, pool: PayloadPool | None = None) -> None:
        """``pool``: payload buffers to share across connections (e.g. preallocated at
        start-up and kept over reconnects); by default each endpoint has its own."""
        self.config = config
        self.decoder = FrameDecoder(config.limits, pool)
        self.state = Conn.IDLE  # every change after this one is wire/table.py's
        self.version: int | None = None
        self.session: int | None = None
        self.limits: Limits = config.limits  # becomes the negotiated limits
        self.peer: Identity | None = None
        self.slots: list[SlotTrack] = []
        self.discarded: collections.Counter = collections.Counter()  # Reason -> frames
        self.failures: collections.Counter = collections.Counter()  # Reason -> proposals
        self._outbox: list[bytes] = []

    # -- public -------------------------------------------------------------

    @property
    def state(self) -> Conn:
        return self._state

    @state.setter
    def state(self, new: Conn) -> None:
        # the decoder refuses, at its header, any frame this state would refuse once read
        self._state = new
        self.decoder.accepts = receivable(self.role, new)

    @property
    def vocab(self) -> int:
        return self.config.identity.vocab

    def data_to_send(self) -> bytes:
        """Bytes the endpoint produced on its own (answers, refusals). Write them out."""
        out, self._outbox = b"".join(self._outbox), []
        return out

    def receive_data(self, data, now: float) -> list:
        """Feed received bytes; returns events. Raises RemoteProtocolError on a
        violation that breaks the stream (the endpoint is then in state ERROR)."""
        return self._consume(lambda: self.decoder.iter_frames(data), now)

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """asyncio.BufferedProtocol hook: where the next received bytes should go."""
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int, now: float) -> list:
        """asyncio.BufferedProtocol hook: ``nbytes`` landed in ``get_buffer()``'s view."""
        return self._consume(lambda: self.decoder.iter_buffer_updated(nbytes), now)

    # -- shared internals ---------------------------------------------------

    def _consume(self, frames, now: float) -> list:
        # each frame is handled as soon as it is complete (its payload still in cache)
        check_usable(self)
        events: list = []
        try:
            for frame in frames():
                check_receiving(self)
                self._on_frame(frame, now, events)
        except RemoteProtocolError:
            conn_event(self, Pseudo.ERROR)
            raise
        return events

    def _on_frame(self, frame: Frame, now: float, events: list) -> None:
        raise NotImplementedError

    def _start_session(self, version: int, limits: Limits, peer: Identity) -> None:
        self.version, self.limits, self.peer = version, limits, peer
        self.decoder.limits = limits
        self.slots = [SlotTrack() for _ in range(limits.max_slots)]

    def _check_session(self, msg, err: type) -> None:
        if msg.session != self.session:
            raise err(Reason.WRONG_IDENTITY, f"session {msg.session} is not {self.session}")

    def _slot(self, slot: int, err: type) -> SlotTrack:
        if not 0 <= slot < len(self.slots):
            raise err(Reason.SLOT_OUT_OF_RANGE, f"slot {slot} >= {len(self.slots)}")
        return self.slots[slot]

    @property
    def inflight(self) -> int:
        busy = (SlotState.STEPPING, SlotState.DRAFTING)
        return sum(1 for s in self.slots if s.state in busy)

    def at_inflight_cap(self) -> bool:
        """No step may start on an idle slot now: max_inflight are outstanding. Counted
        only where the cap is below the slot count: a step starts on an IDLE slot (the
        slot table), so with no more slots than the cap the others cannot reach it, and
        counting every slot for every STEP made a round of N steps cost N^2."""
        cap = self.limits.max_inflight
        return len(self.slots) > cap and self.inflight >= cap
