"""Golden wire v2 frames: build them, and (run as a script) write tests/vectors/*.bin.

    python tests/support/wire_vectors.py        # regenerate after a deliberate wire change
    python tests/support/wire_vectors.py --doc  # the hex blocks of docs/wire.md

Small shapes (vocabulary 16, dense rows padded to 20 entries, sparse support <= 4, the
sparse step's top_k 2) keep every vector short enough to print in docs/wire.md. The sparse
step is one a PROPOSAL answers (``sizes.proposal_fits``: depth 5 x top_k 2 x 8 bytes = 80,
the largest payload these limits allow); its first row is the sparse REPLY's. A change to
any of these bytes is a wire change: bump the version and say so.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from pp1q.core.errors import Reason
from pp1q.core.prefix import digest_of
from pp1q.core.q import SEMANTIC_ID, build_row
from pp1q.core.rng import RNG_ABI_ID
from pp1q.wire import (
    CONNECTION_SLOT,
    WIRE_REVISION,
    WIRE_V1,
    WIRE_V2,
    Commit,
    Completion,
    Form,
    Hello,
    HelloAnswer,
    Identity,
    Limits,
    Refusal,
    Reset,
    Status,
    Step,
    context_of,
    encode,
    proposal_from_rows,
    reply_from_row,
)

VECTOR_DIR = Path(__file__).resolve().parents[1] / "vectors"
VOCAB = 16
LIMITS = Limits.make(vocab=VOCAB, max_slots=4, max_depth=5, max_support=4, max_inflight=4,
                     dense_len=20, max_context=64)
IDENTITY = Identity(
    q_semantic_id=SEMANTIC_ID, verifier_id="standard-v1", vocab=VOCAB,
    id_map_hash="xxh3:00c0ffee00c0ffee", draft_id="toy-draft", draft_adapted=False,
    target_id="toy-target", rng_abi=RNG_ABI_ID, precision="fp32-le",
)
SESSION = 0x0123456789ABCDEF
LOGITS = np.array([0.5, -1.0, 2.0, 0.0, -np.inf, 1.5, -2.0, 0.25,
                   -0.5, 1.0, -3.0, 0.75, -np.inf, 0.1, -1.5, 0.3])
DENSE_ROW = build_row(LOGITS, temperature=0.75)
SPARSE_TOP_K = 2
SPARSE_ROW = build_row(LOGITS, temperature=0.75, top_k=SPARSE_TOP_K)
# the sparse step's 5 positions, each row its own ids and q: row 1 is SPARSE_ROW, row i > 1
# from the logits plus themselves rotated by 3(i-1); each token one of its row's support
# (the first and second id in turn)
PROPOSAL_ROWS = [SPARSE_ROW] + [
    build_row(LOGITS + np.roll(LOGITS, 3 * i), temperature=0.75, top_k=SPARSE_TOP_K)
    for i in range(1, 5)]
PROPOSAL_TOKENS = [int(row.ids[i % 2]) for i, row in enumerate(PROPOSAL_ROWS)]
CONTEXT_TOKENS = [3, 1, 4, 1, 5, 9, 2, 6]  # a prompt of 8 tokens, then a fallback's 5
STEP = dict(session=SESSION, slot=2, generation=7, round_id=3, last_committed=41, first_position=42,
            prefix_digest=0x5EED5EED5EED5EED, depth=5, context_version=1, seed=2024)


def messages() -> dict[str, object]:
    """name -> message, one per message type and row form."""
    reply = dict(session=SESSION, slot=2, generation=7, round_id=3, index=1, position=42)
    return {
        "hello": Hello(session=SESSION, versions=[WIRE_V1, WIRE_V2], identity=IDENTITY,
                       limits=LIMITS, revision=WIRE_REVISION),
        "hello_answer": HelloAnswer(session=SESSION, version=WIRE_V2, identity=IDENTITY,
                                    limits=LIMITS, revision=WIRE_REVISION),
        "context": context_of(session=SESSION, slot=1, generation=2, tokens=CONTEXT_TOKENS,
                              digest=digest_of(CONTEXT_TOKENS)),
        "context_append": context_of(session=SESSION, slot=1, generation=3, tokens=[5],
                                     start=len(CONTEXT_TOKENS),
                                     digest=digest_of(CONTEXT_TOKENS + [5])),
        "step_dense": Step(**STEP, temperature=0.75, top_k=0),
        "step_sparse": Step(**STEP, temperature=0.75, top_k=SPARSE_TOP_K),
        "step_greedy": Step(**STEP, temperature=0.0, top_k=0),
        "reply_dense": reply_from_row(**reply, token=2, row=DENSE_ROW, form=Form.DENSE,
                                      dense_len=LIMITS.dense_len),
        "reply_sparse": reply_from_row(**reply, token=2, row=SPARSE_ROW, form=Form.SPARSE),
        "reply_token_only": reply_from_row(**reply, token=2, row=None, form=Form.TOKEN_ONLY),
        "proposal": proposal_from_rows(session=SESSION, slot=2, generation=7, round_id=3,
                                       first_position=42, context_version=1,
                                       tokens=PROPOSAL_TOKENS, rows=PROPOSAL_ROWS),
        "completion": Completion(session=SESSION, slot=2, generation=7, round_id=3,
                                 first_position=42, context_version=1, rows=5,
                                 reply_bytes=1234, reply_checksum=0x0DDBA11CAFEF00D5,
                                 status=Status.OK, reason=""),
        "completion_aborted": Completion(session=SESSION, slot=2, generation=7, round_id=3,
                                         first_position=42, context_version=1, rows=2,
                                         reply_bytes=456, reply_checksum=0,
                                         status=Status.ABORTED,
                                         reason=Reason.ALLOCATION_INCONSISTENT.value),
        "commit": Commit(session=SESSION, slot=2, generation=7, round_id=3, accepted=3,
                         token=9, committed=45),
        "reset": Reset(session=SESSION, slot=2, generation=7, reason=Reason.STEP_TIMEOUT),
        "refusal": Refusal(session=SESSION, slot=CONNECTION_SLOT, generation=0, round_id=0,
                           reason=Reason.WRONG_IDENTITY, detail="mismatched draft_id"),
    }


def build() -> dict[str, bytes]:
    return {name: encode(msg) for name, msg in messages().items()}


def load() -> dict[str, bytes]:
    return {p.stem: p.read_bytes() for p in sorted(VECTOR_DIR.glob("*.bin"))}


def hexdump(data: bytes) -> str:
    """16 bytes per line with offsets: the form docs/wire.md shows (and a test checks)."""
    return "\n".join(f"{i:04x}: {data[i:i + 16].hex(' ')}" for i in range(0, len(data), 16))


def doc_blocks() -> str:
    """The vectors section of docs/wire.md (``python tests/support/wire_vectors.py --doc``)."""
    out = []
    for name, data in build().items():
        out.append(f"`{name}.bin` ({len(data)} bytes)\n\n```\n{hexdump(data)}\n```\n")
    return "\n".join(out)


def main() -> int:
    if "--doc" in sys.argv:
        print(doc_blocks())
        return 0
    VECTOR_DIR.mkdir(exist_ok=True)
    for name, data in build().items():
        (VECTOR_DIR / f"{name}.bin").write_bytes(data)
        print(f"{name}.bin  {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
