"""The asyncio protocol of the verifier's connection to the worker (WorkerLink's bytes).

Received bytes land straight in the endpoint's buffers (asyncio.BufferedProtocol) and
the events they complete go to the link. A stream the endpoint rejects is unusable: the
open steps fail (``ProposalFailed`` through the link), the failure is counted (as a
refused HELLO too when the session had not started), and the connection is dropped.
"""

from __future__ import annotations

import asyncio
import logging

from pp1q.core.errors import RemoteProtocolError
from pp1q.wire import VerifierEndpoint

log = logging.getLogger("pp1q.verifier")


class WireProtocol(asyncio.BufferedProtocol):
    def __init__(self, link, endpoint: VerifierEndpoint) -> None:
        """``link``: the pp1q.verifier.link.WorkerLink this connection serves."""
        self.link, self.endpoint = link, endpoint
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self.rejected: RemoteProtocolError | None = None  # why this end dropped the stream

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.endpoint.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.link.metrics.reply_bytes.inc(nbytes)
        now = asyncio.get_running_loop().time()
        try:
            events = self.endpoint.buffer_updated(nbytes, now)
        except RemoteProtocolError as e:  # the stream is unusable: fail open steps, drop it
            # a peer that answers every reconnection so: a line a reason per interval
            self.rejected = e
            self.link.metrics.logs.log(log, logging.WARNING, ("invalid", e.reason),
                                       "worker sent invalid data (%s); dropping the "
                                       "connection", e)
            self.link.metrics.validation_failure(e.reason)
            # frames are handled one at a time: a HELLO answer accepted earlier in this
            # read started the session (peer set); a frame after it is not a refused HELLO
            if self.endpoint.peer is None:  # its HELLO answer (identity, version, limits)
                self.link.metrics.hello_refused(e.reason)
                self.link.refused = e.reason
            self.link.on_events(self.endpoint.close(e.reason), stream_error=True)
            self.transport.close()
            return
        if events:  # a read inside a payload changes no slot, so no deadline: most reads
            # of a dense round (two or three a 517 KB row) skip the watchdog's re-arm
            self.link.on_events(events)

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
