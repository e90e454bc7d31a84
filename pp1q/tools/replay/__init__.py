"""Decoding and replaying capture files (pp1q.runtime.capture): ``pp1q replay``.

- ``streams.decode(role, records)``: decoded messages per connection and direction.
- ``analyse.Analyser``: protocol-analyser lines (``--verbose``: q row details).
- ``verifier.replay_verifier(path, target=...)``: the worker's frames through a fresh
  in-memory ``VerifierEndpoint`` driven by the verifier's own frames; events, commits
  and divergences; with a target, every validated round is decided again.
- ``live.replay_live(role, records, host, port)``: the verifier's frames to a live
  worker over TCP, its answers compared with the captured ones per STEP (sans-IO core:
  ``live_core``, the replay's course, over ``live_script``, ``live_stream``,
  ``answer_matcher``, ``step_match``, ``answers`` and ``live_report``).
"""

from pp1q.tools.replay.reverify import Reverifier, target_from_identity
from pp1q.tools.replay.streams import Flow, Item, decode, flow_of
from pp1q.tools.replay.verifier import (
    CommitRecord,
    Divergence,
    ReplayReport,
    VerifierReplay,
    replay_verifier,
)

__all__ = [
    "CommitRecord", "Divergence", "Flow", "Item", "ReplayReport", "Reverifier",
    "VerifierReplay", "decode", "flow_of", "replay_verifier", "target_from_identity",
]
