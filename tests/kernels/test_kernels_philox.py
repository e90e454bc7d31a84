import numpy as np
import pytest
import torch

from pp1q.core import rng
from pp1q.core.errors import LocalProtocolError, Reason
from pp1q_kernels import philox

KAT = [  # Random123 known answers (../shared/ANCHORS.md)
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_torch_philox_known_answers(ctr, key, expected):
    assert philox.philox4x32_10(torch.tensor(ctr), torch.tensor(key)).tolist() == expected


def test_torch_philox_equals_numpy_on_random_words():
    g = np.random.default_rng(3)
    ctr = g.integers(0, 2**32, (4000, 4), dtype=np.uint64)
    key = g.integers(0, 2**32, (4000, 2), dtype=np.uint64)
    got = philox.philox4x32_10(torch.tensor(ctr.astype(np.int64)),
                               torch.tensor(key.astype(np.int64)))
    assert np.array_equal(got.numpy(), rng.philox4x32_10(ctr, key).astype(np.int64))


def test_keyed_draws_equal_pp1q_rng_for_every_domain_and_high_seeds():
    g = np.random.default_rng(4)
    seeds = [0, 1, 2**32, 2**63, 2**64 - 1] + [int(s) for s in g.integers(0, 2**63, 5)]
    pos = torch.arange(6) * 977 + 2**32 - 6 * 977  # reaches the top of the 32-bit field
    for s in seeds:
        st = philox.seed_tensor([s])
        for dom in rng.Domain:
            words = philox.keyed_words(st, 2**24 - 1, 7, pos, dom)
            ref = rng.draw_words(s, 2**24 - 1, 7, pos.numpy(), dom)
            assert np.array_equal(words.numpy(), ref.astype(np.int64))
            assert np.array_equal(philox.u53(words).numpy(), rng.u53_from_words(ref))
        assert philox.keyed_u24(st, 3, 4, 5).tolist() == [rng.proposal_u24(s, 3, 4, 5)]


def test_every_request_in_a_batch_uses_its_own_seed():
    """FlashInfer's kernel read seed[0] for the whole batch (ANCHORS): not here."""
    seeds = [11, 2**64 - 3, 12345678901234, 11]
    batch = philox.keyed_u53(philox.seed_tensor(seeds), 1, 2, 40, rng.Domain.CORRECTION)
    alone = [rng.uniform53(s, 1, 2, 40, rng.Domain.CORRECTION) for s in seeds]
    assert batch.tolist() == alone
    seed0_only = [rng.uniform53(seeds[0], 1, 2, 40, rng.Domain.CORRECTION)] * len(seeds)
    assert batch.tolist() != seed0_only  # the planted bug would be visible
    assert batch[0] == batch[3] and len(set(batch.tolist())) == 3


@pytest.mark.parametrize("field", [dict(generation=1 << 24), dict(round_id=1 << 32),
                                   dict(position=-1), dict(counter=1 << 32)])
def test_out_of_range_fields_refused(field):
    args = dict(generation=0, round_id=0, position=0, counter=0) | field
    with pytest.raises(LocalProtocolError) as e:
        philox.keyed_words(philox.seed_tensor([1]), domain=rng.Domain.BONUS, **args)
    assert e.value.reason == Reason.RNG_KEY_OUT_OF_RANGE
