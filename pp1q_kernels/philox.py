"""Philox4x32-10 and the keyed draws of pp1q.core.rng, batched in torch (any device).

Same words as ``pp1q.core.rng.philox4x32_10`` and Triton's ``tl.philox`` (tests prove it).
Words are held in int64 (values in [0, 2^32)); 32x32-bit products are formed from
16-bit halves so that no intermediate leaves int64 (no reliance on signed overflow).

Every draw is keyed per request: ``seeds`` is a tensor, one 64-bit seed per request
(stored two's-complement in int64), never a single seed for the batch.
"""

from __future__ import annotations

import torch

from pp1q.core.errors import LocalProtocolError, Reason
from pp1q.core.rng import Domain

_M0 = 0xD2511F53
_M1 = 0xCD9E8D57
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85
_LO32 = 0xFFFFFFFF
_LO16 = 0xFFFF
ROUNDS = 10
DOMAIN_SHIFT = 24  # counter word 3 = domain << 24 | generation (pp1q.core.rng)
MAX_GENERATION = (1 << DOMAIN_SHIFT) - 1  # generation owns the low 24 bits of word 3


def _mulhilo(m: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of m * x for a 32-bit constant m and words x."""
    t_lo = m * (x & _LO16)  # < 2^48
    t_hi = m * (x >> 16)  # < 2^48
    lo = (t_lo + ((t_hi & _LO16) << 16)) & _LO32
    hi = (t_hi + (t_lo >> 16)) >> 16
    return hi, lo


def philox4x32_10(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """counter (..., 4) and key (..., 2) int64 words -> (..., 4) int64 words."""
    c0, c1, c2, c3 = (counter[..., i] & _LO32 for i in range(4))
    k0 = key[..., 0] & _LO32
    k1 = key[..., 1] & _LO32
    for r in range(ROUNDS):
        if r:
            k0 = (k0 + _W0) & _LO32
            k1 = (k1 + _W1) & _LO32
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack([c0, c1, c2, c3], dim=-1)


def seed_tensor(seeds, device=None) -> torch.Tensor:
    """64-bit request seeds (Python ints in [0, 2^64)) as two's-complement int64."""
    vals = [int(s) - (1 << 64) if int(s) >= 1 << 63 else int(s) for s in seeds]
    return torch.tensor(vals, dtype=torch.int64, device=device)


def _field(name: str, v, top: int, dev) -> torch.Tensor:
    t = torch.as_tensor(v, dtype=torch.int64, device=dev)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) > top):
        raise LocalProtocolError(Reason.RNG_KEY_OUT_OF_RANGE, f"{name} outside [0, {top}]")
    return t


def keyed_words(seeds, generation, round_id, position, domain: Domain, counter=0):
    """Philox words for keyed draws; all arguments broadcast (int64 tensors or ints).

    key = (seed low word, seed high word); counter = (counter, position, round,
    domain << 24 | generation), exactly as pp1q.core.rng.pack_counter / pack_key. Field
    ranges are checked as in pp1q.core.rng, so fields never overlap.
    """
    seeds = torch.as_tensor(seeds, dtype=torch.int64)
    dev = seeds.device
    ctr, pos, rnd, gen, sd = torch.broadcast_tensors(
        _field("draw counter", counter, _LO32, dev),
        _field("position", position, _LO32, dev),
        _field("round", round_id, _LO32, dev),
        _field("generation", generation, MAX_GENERATION, dev),
        seeds,
    )
    key = torch.stack([sd & _LO32, (sd >> 32) & _LO32], -1)
    word3 = (int(Domain(domain)) << DOMAIN_SHIFT) | gen
    return philox4x32_10(torch.stack([ctr, pos, rnd, word3], -1), key)


def u24(words: torch.Tensor) -> torch.Tensor:
    """24-bit proposal draws: word0 >> 8."""
    return words[..., 0] >> 8


def u53(words: torch.Tensor) -> torch.Tensor:
    """53-bit draws: ((word0 << 32) | word1) >> 11, formed without leaving int64."""
    return (words[..., 0] << 21) | (words[..., 1] >> 11)


def keyed_u53(seeds, generation, round_id, position, domain: Domain, counter=0):
    return u53(keyed_words(seeds, generation, round_id, position, domain, counter))


def keyed_u24(seeds, generation, round_id, position, counter=0):
    return u24(keyed_words(seeds, generation, round_id, position, Domain.PROPOSAL, counter))
