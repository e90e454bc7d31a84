"""The verifier's draw key: its draws are keyed by material the worker never receives.

The worker must know the PROPOSAL key (it samples x_i with it), so the STEP carries the
request seed s. If the verifier's own draws were keyed by s too, the worker could compute
each acceptance draw before it chooses q and shape q so that its draft passes
(docs/security.md, "the steering attack"). So the verifier keys ACCEPTANCE, CORRECTION,
BONUS and TARGET_ONLY by

    draw_seed = first 8 bytes, big-endian, of HMAC-SHA256(secret, LABEL || s as 8 bytes)

with a secret that only the verifier (and its rank group) holds. Same seed and same
secret give the same draw seed; a round's draws also count its slot's generation and its
round id, so a request repeats its output where it runs under the same generation (one
at a time on a fresh verifier, say), not in general: a speculative request's generation
is its slot's counter, which grows with every request the slot serves. The secret
never travels in STEP, logs or capture files: a capture records only ``fingerprint``
(docs/distribution.md).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from pp1q.core.errors import ConfigError, LocalProtocolError, Reason

DRAW_KEY_ID = "hmac-sha256:pp1q-verifier-draws:v1"  # names the derivation (captures)
LABEL = b"pp1q-verifier-draws:v1\0"  # domain-separates this use of the secret
_FINGERPRINT_LABEL = b"pp1q-draw-secret-fingerprint:v1\0"
MIN_SECRET_BYTES = 16  # 128 bits: guessing the secret from outputs is out of reach
MAX_SECRET_BYTES = 64  # HMAC-SHA256's block size; a longer key is hashed first, no gain
GENERATED_SECRET_BYTES = 32
_MAX_SEED = (1 << 64) - 1


class DrawKeys:
    """The secret and the per-request draw seeds it gives. ``repr`` shows only the
    fingerprint, so a log line or a traceback never prints the secret."""

    __slots__ = ("_secret", "fingerprint")

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes | bytearray):
            raise ConfigError("the draw secret must be bytes", key="draw_secret_file")
        if not MIN_SECRET_BYTES <= len(secret) <= MAX_SECRET_BYTES:
            raise ConfigError(f"the draw secret must be {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} "
                              f"bytes ({2 * MIN_SECRET_BYTES}..{2 * MAX_SECRET_BYTES} hex "
                              f"digits), not {len(secret)}", key="draw_secret_file")
        self._secret = bytes(secret)
        self.fingerprint = hashlib.sha256(_FINGERPRINT_LABEL + self._secret).hexdigest()[:16]

    @classmethod
    def generate(cls) -> DrawKeys:
        return cls(secrets.token_bytes(GENERATED_SECRET_BYTES))

    @classmethod
    def from_hex(cls, text: str) -> DrawKeys:
        try:
            return cls(bytes.fromhex(text.strip()))
        except ValueError:
            raise ConfigError("the draw secret is not hex digits",
                              key="draw_secret_file") from None

    def hex(self) -> str:
        """The secret itself: only for handing it to the rank group at join."""
        return self._secret.hex()

    def seed_for(self, seed: int) -> int:
        """The 64-bit Philox key of the verifier's draws for request seed ``seed``."""
        if isinstance(seed, bool) or not 0 <= int(seed) <= _MAX_SEED:
            raise LocalProtocolError(Reason.RNG_KEY_OUT_OF_RANGE, f"seed {seed!r}")
        mac = hmac.new(self._secret, LABEL + int(seed).to_bytes(8, "big"), hashlib.sha256)
        return int.from_bytes(mac.digest()[:8], "big")

    def __repr__(self) -> str:
        return f"DrawKeys(fingerprint={self.fingerprint})"
