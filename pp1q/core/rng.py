"""Keyed counter-based randomness: Philox4x32-10, one stream per decision domain.

Every random decision in pp1q is a pure function of
(request seed, generation, round, absolute position, domain, draw counter):

    key     = (seed & 0xFFFFFFFF, seed >> 32)          # Triton: tl.philox seed = key0 | key1 << 32
    counter = (draw_counter, position, round_id, domain << 24 | generation)

Field widths: seed 64 bits, draw counter 32, position 32, round 32, generation 24,
domain 8. Each field owns its bits, so distinct tuples never share a Philox counter
(tests/core/test_rng.py proves the packing injective), and domains never share noise.
``RNG_ABI_ID`` names this packing and goes into HELLO: a change here is an ABI change.
"""

from __future__ import annotations

import enum
from fractions import Fraction

import numpy as np

from pp1q.core.errors import LocalProtocolError, Reason

RNG_ABI_ID = "philox4x32-10:c=(ctr,pos,round,dom<<24|gen):k=seed64:v1"

U24_BITS = 24
U53_BITS = 53  # integer uniforms of 53 bits are exact as float64 (U = u53 * 2^-53)

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_LO = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)

_MAX_GENERATION = (1 << 24) - 1
_MAX_WORD = (1 << 32) - 1
_MAX_SEED = (1 << 64) - 1


class Domain(enum.IntEnum):
    """Decision domains; noise is never shared between two of them."""

    PROPOSAL = 1
    ACCEPTANCE = 2
    CORRECTION = 3
    BONUS = 4
    TARGET_ONLY = 5


def philox4x32_10(counter, key) -> np.ndarray:
    """Philox4x32 with 10 rounds (Random123), vectorised.

    ``counter``: (..., 4) uint32-compatible; ``key``: (..., 2). Returns (..., 4) uint32.
    """
    c = np.asarray(counter, dtype=np.uint64)
    k = np.asarray(key, dtype=np.uint64)
    if c.shape[-1] != 4 or k.shape[-1] != 2:
        raise ValueError("counter needs 4 words and key 2 words")
    c0, c1, c2, c3 = (c[..., i] & _LO for i in range(4))
    k0 = k[..., 0] & _LO
    k1 = k[..., 1] & _LO
    for r in range(10):
        if r:
            k0 = (k0 + _W0) & _LO  # 32-bit wrap, as in Random123
            k1 = (k1 + _W1) & _LO
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = (
            (p1 >> _S32) ^ c1 ^ k0,
            p1 & _LO,
            (p0 >> _S32) ^ c3 ^ k1,
            p0 & _LO,
        )
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def _check(name: str, value, top: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        raise LocalProtocolError(Reason.RNG_KEY_OUT_OF_RANGE, f"{name} must be an integer")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > top):
        raise LocalProtocolError(Reason.RNG_KEY_OUT_OF_RANGE, f"{name} outside [0, {top}]")
    return arr.astype(np.uint64)


def pack_counter(generation, round_id, position, domain, counter=0) -> np.ndarray:
    """The four counter words (..., 4) for the given fields (broadcast)."""
    gen = _check("generation", generation, _MAX_GENERATION)
    rnd = _check("round", round_id, _MAX_WORD)
    pos = _check("position", position, _MAX_WORD)
    ctr = _check("draw counter", counter, _MAX_WORD)
    dom = np.asarray(int(Domain(domain)), dtype=np.uint64)
    gen, rnd, pos, ctr = np.broadcast_arrays(gen, rnd, pos, ctr)
    return np.stack([ctr, pos, rnd, (dom << np.uint64(24)) | gen], axis=-1)


def _key_words(seed: int) -> tuple[int, int]:
    """The key's (low, high) 32-bit words of a 64-bit seed."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise LocalProtocolError(Reason.RNG_KEY_OUT_OF_RANGE, f"seed {seed!r}")
    seed = int(seed)
    if not 0 <= seed <= _MAX_SEED:
        raise LocalProtocolError(Reason.RNG_KEY_OUT_OF_RANGE, "seed outside [0, 2^64)")
    return seed & _MAX_WORD, seed >> 32


def pack_key(seed: int) -> np.ndarray:
    return np.array(_key_words(seed), dtype=np.uint64)


def draw_words(seed: int, generation, round_id, position, domain, counter=0) -> np.ndarray:
    """Philox output words (..., 4) for keyed draws; positions etc. may be arrays."""
    return philox4x32_10(pack_counter(generation, round_id, position, domain, counter),
                         pack_key(seed))


def u24_from_words(words: np.ndarray) -> np.ndarray:
    """24-bit integer uniforms in [0, 2^24) (top bits of word 0)."""
    return (np.asarray(words)[..., 0] >> np.uint32(8)).astype(np.int64)


def u53_from_words(words: np.ndarray) -> np.ndarray:
    """53-bit integer uniforms in [0, 2^53) (words 0 and 1)."""
    w = np.asarray(words).astype(np.uint64)
    return (((w[..., 0] << _S32) | w[..., 1]) >> np.uint64(11)).astype(np.int64)


# one draw at a time (every proposal row, the float64 path's draws): Python integers,
# ~6 us a draw where the vectorised form's small-array numpy calls take ~45-75 us
_M0_INT, _M1_INT, _W0_INT, _W1_INT = int(_M0), int(_M1), int(_W0), int(_W1)


def _word(name: str, value, top: int) -> int:
    """``_check`` for one scalar field: an integer (not a bool) in [0, top]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise LocalProtocolError(Reason.RNG_KEY_OUT_OF_RANGE, f"{name} must be an integer")
    if not 0 <= int(value) <= top:
        raise LocalProtocolError(Reason.RNG_KEY_OUT_OF_RANGE, f"{name} outside [0, {top}]")
    return int(value)


def _draw(seed: int, generation: int, round_id: int, position: int,
          domain: Domain) -> tuple[int, int]:
    """Words 0 and 1 of ``draw_words(...)`` (draw counter 0) for one position, from the
    same fields, checked the same way, and the same rounds as ``philox4x32_10``."""
    k0, k1 = _key_words(seed)
    c0, c1 = 0, _word("position", position, _MAX_WORD)
    c2 = _word("round", round_id, _MAX_WORD)
    c3 = (int(Domain(domain)) << 24) | _word("generation", generation, _MAX_GENERATION)
    for r in range(10):
        if r:
            k0 = (k0 + _W0_INT) & _MAX_WORD
            k1 = (k1 + _W1_INT) & _MAX_WORD
        p0 = _M0_INT * c0
        p1 = _M1_INT * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & _MAX_WORD, (p0 >> 32) ^ c3 ^ k1, p0 & _MAX_WORD
    return c0, c1


def proposal_u24(seed: int, generation: int, round_id: int, position: int) -> int:
    """The worker leader's 24-bit proposal draw for one absolute position (``u24_from_words``
    of ``draw_words``, computed for one position)."""
    return _draw(seed, generation, round_id, position, Domain.PROPOSAL)[0] >> 8


def uniform53(seed: int, generation: int, round_id: int, position: int, domain: Domain) -> int:
    """One 53-bit integer uniform for a verifier-side decision (acceptance, residual...):
    ``u53_from_words`` of ``draw_words``, computed for one position."""
    w0, w1 = _draw(seed, generation, round_id, position, domain)
    return ((w0 << 32) | w1) >> 11


def accepts(u53: int, p: Fraction, q: Fraction) -> bool:
    """Exact ratio test U = u53 / 2^53 < p / q, compared in integers (q > 0).

    Strict: a token with p = 0 is never accepted, whatever the draw (no float-0 hazard).
    """
    if q <= 0:
        raise ValueError("q must be positive at a proposed token")
    p, q = Fraction(p), Fraction(q)
    return u53 * q.numerator * p.denominator < (p.numerator * q.denominator) << U53_BITS
