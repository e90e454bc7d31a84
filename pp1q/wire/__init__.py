"""Wire v2: messages, framing, validators and sans-IO endpoints (docs/wire.md).

Stable public surface: the message classes, ``encode``, ``FrameDecoder``, the
endpoints and their events, ``Limits``/``DEFAULT_LIMITS``, and the two error classes;
for raw-byte readers, the frame header (``HEADER``, ``read_header``; offsets and checksum
helpers in pp1q.wire.framing). ``WIRE_REVISION``: the revision of v2 spoken (HELLO).
"""

from pp1q.core.errors import LocalProtocolError, Reason, RemoteProtocolError
from pp1q.wire.decoder import FrameDecoder
from pp1q.wire.endpoint import WireConfig
from pp1q.wire.events import (
    Committed,
    ContextReceived,
    ContextRefused,
    Discarded,
    Event,
    ProposalFailed,
    ProposalReady,
    SessionRefused,
    SessionStarted,
    SlotReset,
    StepRefused,
    StepRequested,
)
from pp1q.wire.framing import (
    FRAME_VERSION,
    HEADER,
    HEADER_BYTES,
    MAGIC,
    Frame,
    Header,
    chain_checksum,
    encode,
    read_header,
)
from pp1q.wire.limits import DEFAULT_LIMITS, Limits
from pp1q.wire.messages import (
    CONNECTION_SLOT,
    WIRE_REVISION,
    WIRE_V1,
    WIRE_V2,
    Commit,
    Completion,
    Context,
    Form,
    Hello,
    HelloAnswer,
    Identity,
    Message,
    MsgType,
    Proposal,
    Refusal,
    Reply,
    Reset,
    Status,
    Step,
    context_of,
)
from pp1q.wire.pool import PayloadPool
from pp1q.wire.proposal import proposal_from_rows
from pp1q.wire.reply_rows import reply_from_row
from pp1q.wire.table import Conn, SlotState
from pp1q.wire.verifier_endpoint import VerifierEndpoint
from pp1q.wire.worker_endpoint import WorkerEndpoint

__all__ = [
    "CONNECTION_SLOT", "DEFAULT_LIMITS", "FRAME_VERSION", "HEADER", "HEADER_BYTES", "MAGIC",
    "WIRE_REVISION", "WIRE_V1", "WIRE_V2", "Header", "read_header",
    "Commit", "Committed", "Completion", "Context", "ContextReceived", "ContextRefused",
    "Conn", "Discarded", "Event", "Form", "Frame",
    "FrameDecoder", "Hello", "HelloAnswer", "Identity", "Limits", "LocalProtocolError",
    "Message", "MsgType", "PayloadPool", "Proposal", "ProposalFailed", "ProposalReady", "Reason",
    "Refusal",
    "RemoteProtocolError", "Reply", "Reset", "SessionRefused", "SessionStarted", "SlotReset",
    "SlotState", "Status", "Step", "StepRefused", "StepRequested", "VerifierEndpoint",
    "WireConfig", "WorkerEndpoint", "chain_checksum", "context_of", "encode",
    "proposal_from_rows", "reply_from_row",
]
