"""Wire v2 configuration of the daemons: the HELLO identity and the offered limits.

Both ends build the identity from the toy model spec (vocabulary and model seed), so a
worker and a verifier started with different ``--vocab`` or ``--model-seed`` refuse each
other at HELLO (``Reason.WRONG_IDENTITY``) before any buffer is sized. Real models give
an ``Identity`` instead (``engine_identity``: tokenizer digest, drafter and target
identities), refused the same way when any of them differs.
"""

from __future__ import annotations

from pp1q.core.q import SEMANTIC_ID
from pp1q.core.rng import RNG_ABI_ID
from pp1q.models.toy import ToySpec, vocab_map_id
from pp1q.wire import Identity, Limits, WireConfig
from pp1q.wire.limits import DEFAULT_MAX_CONTEXT

VERIFIER_ID = "pp1q-standard-v1"  # ratio test + full-vocabulary residual, docs/distribution.md
PRECISION = "fp32-le"  # q values travel as little-endian IEEE-754 binary32
WORKER_MAX_SLOTS = 64  # the worker's offer; the verifier's smaller need wins at HELLO
WORKER_MAX_DEPTH = 16  # ditto; the design fixes depth 5
DEFAULT_MAX_SUPPORT = 256  # sparse top-k bound offered by both ends (the seed's k=256 screen)


def identity(spec: ToySpec | Identity) -> Identity:
    if isinstance(spec, Identity):
        return spec
    return engine_identity(spec.vocab, vocab_map_id(spec.vocab), spec.draft_identity,
                           spec.target_identity)


def engine_identity(vocab: int, id_map_hash: str, draft_id: str, target_id: str,
                    draft_adapted: bool = False) -> Identity:
    """A pair's identity: the tokenizer digest is the id map, the engines' identities
    name the drafter and the target (pp1q.models.serving builds them for real models),
    ``draft_adapted`` whether the drafter is adapted to the target (an exit adapter) or
    native to it (the toy's drafter, an exit as it is, a draft checkpoint)."""
    return Identity(q_semantic_id=SEMANTIC_ID, verifier_id=VERIFIER_ID, vocab=vocab,
                    id_map_hash=id_map_hash, draft_id=draft_id, draft_adapted=draft_adapted,
                    target_id=target_id, rng_abi=RNG_ABI_ID, precision=PRECISION)


def worker_config(spec: ToySpec | Identity, versions: tuple[int, ...],
                  max_support: int, drafter_positions: int | None = None) -> WireConfig:
    """``drafter_positions``: the drafter's own context (None: none of its own, as the
    toy's). The worker offers it as ``max_context`` so that HELLO tells the verifier,
    which then runs target-only the rounds whose drafts would pass it (its check for
    the target's context), instead of asking for drafts the drafter cannot place."""
    context = min(DEFAULT_MAX_CONTEXT, drafter_positions or DEFAULT_MAX_CONTEXT)
    limits = Limits.make(vocab=spec.vocab, max_slots=WORKER_MAX_SLOTS,
                         max_depth=WORKER_MAX_DEPTH, max_support=min(max_support, spec.vocab),
                         max_inflight=WORKER_MAX_SLOTS, max_context=context)
    return WireConfig(identity=identity(spec), limits=limits, versions=versions)


def verifier_config(spec: ToySpec | Identity, versions: tuple[int, ...], slots: int, depth: int,
                    max_support: int) -> WireConfig:
    limits = Limits.make(vocab=spec.vocab, max_slots=slots, max_depth=depth,
                         max_support=min(max_support, spec.vocab), max_inflight=slots)
    return WireConfig(identity=identity(spec), limits=limits, versions=versions)
