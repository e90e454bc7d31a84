"""Wire v2: messages, framing, validators and sans-IO endpoints (docs/wire.md).

Stable public surface: the message classes, ``encode``, ``FrameDecoder``, the
endpoints and their events, ``Limits``/``DEFAULT_LIMITS``, and the two error classes.
"""

from ..errors import LocalProtocolError, Reason, RemoteProtocolError
from .endpoint import WireConfig
from .events import (
    Committed,
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
from .framing import FRAME_VERSION, MAGIC, Frame, FrameDecoder, chain_checksum, encode
from .limits import DEFAULT_LIMITS, Limits
from .messages import (
    CONNECTION_SLOT,
    WIRE_V1,
    WIRE_V2,
    Commit,
    Completion,
    Form,
    Hello,
    HelloAnswer,
    Identity,
    Message,
    MsgType,
    Refusal,
    Reply,
    Reset,
    Status,
    Step,
    reply_from_row,
)
from .pool import PayloadPool
from .table import Conn, SlotState
from .verifier_endpoint import VerifierEndpoint
from .worker_endpoint import WorkerEndpoint

__all__ = [
    "CONNECTION_SLOT", "DEFAULT_LIMITS", "FRAME_VERSION", "MAGIC", "WIRE_V1", "WIRE_V2",
    "Commit", "Committed", "Completion", "Conn", "Discarded", "Event", "Form", "Frame",
    "FrameDecoder", "Hello", "HelloAnswer", "Identity", "Limits", "LocalProtocolError",
    "Message", "MsgType", "PayloadPool", "ProposalFailed", "ProposalReady", "Reason", "Refusal",
    "RemoteProtocolError", "Reply", "Reset", "SessionRefused", "SessionStarted", "SlotReset",
    "SlotState", "Status", "Step", "StepRefused", "StepRequested", "VerifierEndpoint",
    "WireConfig", "WorkerEndpoint", "chain_checksum", "encode", "reply_from_row",
]
