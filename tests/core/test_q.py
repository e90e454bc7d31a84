import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pp1q.core.errors import DistributionError, Reason, RowValidationError
from pp1q.core.q import MASS, SEMANTIC_ID, DyadicRow, build_row, parse_dense, parse_sparse, sample


def test_constants():
    assert MASS == 2**24 and SEMANTIC_ID == "dyadic24-standard-v1"


def test_counts_are_floor_plus_largest_remainders_ties_lowest_id():
    # three equal weights: 2^24 = 3 * 5592405 + 1, the single spare ticket goes to id 0
    row = build_row(np.zeros(3))
    assert row.counts.tolist() == [5592406, 5592405, 5592405]
    row = build_row(np.array([-np.inf, 0.0, 0.0, 0.0]))
    assert row.ids.tolist() == [1, 2, 3] and row.counts.tolist() == [5592406, 5592405, 5592405]


def test_masked_logits_get_zero_and_tiny_entries_may_vanish():
    logits = np.array([0.0, -np.inf, -60.0, 0.0])
    row = build_row(logits)
    assert row.count_of(1) == 0 and row.count_of(2) == 0
    assert row.counts.sum() == MASS


@pytest.mark.parametrize("logits,reason", [
    ([0.0, np.nan], Reason.NAN_LOGIT),
    ([0.0, np.inf], Reason.POSINF_LOGIT),
    ([-np.inf, -np.inf], Reason.ZERO_MASS),
])
def test_bad_logits_refused(logits, reason):
    with pytest.raises(DistributionError) as e:
        build_row(np.array(logits))
    assert e.value.reason == reason


@pytest.mark.parametrize("t", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_temperature_refused(t):
    with pytest.raises(DistributionError) as e:
        build_row(np.zeros(4), temperature=t)
    assert e.value.reason == Reason.BAD_TEMPERATURE


def test_top_k_support_ties_by_lowest_id():
    logits = np.array([1.0, 5.0, 5.0, 5.0, 2.0])
    row = build_row(logits, top_k=2)
    assert row.ids.tolist() == [1, 2]
    assert row.counts.tolist() == [MASS // 2, MASS // 2]


def test_top_k_renormalises_within_support():
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    row = build_row(logits, top_k=2)
    assert row.ids.tolist() == [0, 1]
    assert abs(row.counts[0] / MASS - 0.625) < 1e-7


def test_sample_first_cumulative_strictly_greater():
    row = DyadicRow(vocab=5, ids=np.array([1, 3]), counts=np.array([10, MASS - 10]))
    assert sample(row, 0) == 1
    assert sample(row, 9) == 1
    assert sample(row, 10) == 3
    assert sample(row, MASS - 1) == 3
    for bad in (-1, MASS, 2.5):
        with pytest.raises(DistributionError):
            sample(row, bad)


def test_sample_frequencies_are_exact_over_all_draws():
    row = DyadicRow(vocab=3, ids=np.array([0, 2]), counts=np.array([3, MASS - 3]))
    assert [sample(row, u) for u in range(5)] == [0, 0, 0, 2, 2]


@pytest.mark.parametrize("mutate,reason", [
    (lambda q: q.__setitem__(0, np.nan), Reason.NON_FINITE),
    (lambda q: q.__setitem__(0, np.inf), Reason.NON_FINITE),
    (lambda q: q.__setitem__(3, -q[0]), Reason.NEGATIVE_VALUE),
    (lambda q: q.__setitem__(0, np.nextafter(q[0], np.float32(1))), Reason.NON_DYADIC),
    (lambda q: q.__setitem__(0, q[0] + np.float32(2.0**-24)), Reason.WRONG_MASS),
])
def test_parse_dense_refusals(mutate, reason):
    q = build_row(np.array([0.1, 0.2, 0.3, 0.4])).to_dense()
    mutate(q)
    with pytest.raises(RowValidationError) as e:
        parse_dense(q, 4)
    assert e.value.reason == reason


def test_negative_zero_is_refused():
    q = build_row(np.array([0.0, -np.inf])).to_dense()
    q[1] = -0.0
    with pytest.raises(RowValidationError) as e:
        parse_dense(q, 2)
    assert e.value.reason == Reason.NEGATIVE_VALUE


def test_dense_padding_must_be_zero():
    q = build_row(np.zeros(3)).to_dense()
    padded = np.concatenate([q, np.zeros(5, np.float32)])
    assert parse_dense(padded, 3) == parse_dense(q, 3)
    moved = padded.copy()
    moved[0] -= np.float32(2.0**-24)
    moved[6] = np.float32(2.0**-24)
    with pytest.raises(RowValidationError) as e:
        parse_dense(moved, 3)
    assert e.value.reason == Reason.PADDING_NONZERO
    with pytest.raises(RowValidationError) as e:
        parse_dense(q[:2], 3)
    assert e.value.reason == Reason.UNEXPECTED_SIZE


@pytest.mark.parametrize("ids,q,reason", [
    ([1, 1], [0.5, 0.5], Reason.DUPLICATE_ID),
    ([0, 1, 1], [1.0, 0.0, 0.0], Reason.DUPLICATE_ID),  # duplicate zeros too
    ([2, 1], [0.5, 0.5], Reason.UNSORTED_SUPPORT),
    ([0, 4], [0.5, 0.5], Reason.ID_OUT_OF_RANGE),
    ([-1, 0], [0.5, 0.5], Reason.ID_OUT_OF_RANGE),
    ([0, 1], [1.0, 0.0], Reason.NON_CANONICAL),
    ([0, 1], [0.5, 0.25], Reason.WRONG_MASS),
    ([], [], Reason.MISSING_Q),
    ([0, 1], [0.5], Reason.UNEXPECTED_SIZE),
])
def test_parse_sparse_refusals(ids, q, reason):
    with pytest.raises(RowValidationError) as e:
        parse_sparse(np.array(ids, np.int32), np.array(q, np.float32), 4)
    assert e.value.reason == reason


def test_parse_from_little_endian_bytes():
    row = build_row(np.array([0.0, 1.0, 2.0]), top_k=2)
    ids, q = row.to_sparse()
    assert parse_sparse(ids.astype("<i4").tobytes(), q.astype("<f4").tobytes(), 3) == row
    assert parse_dense(row.to_dense().astype("<f4").tobytes(), 3) == row
    with pytest.raises(RowValidationError):
        parse_dense(b"\x00" * 11, 3)


def test_require_token():
    row = build_row(np.array([0.0, -np.inf, 0.0]))
    assert row.require_token(0) == MASS // 2
    with pytest.raises(RowValidationError) as e:
        row.require_token(1)
    assert e.value.reason == Reason.ZERO_Q_AT_TOKEN
    with pytest.raises(RowValidationError) as e:
        row.require_token(3)
    assert e.value.reason == Reason.ID_OUT_OF_RANGE


def test_torch_logits_accepted():
    torch = pytest.importorskip("torch")
    x = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float32)
    assert build_row(x) == build_row(x.double().numpy())


logit_lists = st.lists(
    st.one_of(st.floats(-30, 30, allow_nan=False), st.just(float("-inf"))), min_size=1, max_size=40
).filter(lambda xs: any(x != float("-inf") for x in xs))


@settings(max_examples=200, deadline=None)
@given(logit_lists, st.floats(0.05, 5.0), st.one_of(st.none(), st.integers(1, 50)))
def test_build_row_invariants_and_round_trips(logits, temperature, top_k):
    x = np.array(logits)
    row = build_row(x, temperature=temperature, top_k=top_k)
    assert row.counts.sum() == MASS and (row.counts > 0).all()
    assert (np.diff(row.ids) > 0).all()
    assert all(np.isfinite(x[i]) for i in row.ids)
    if top_k is not None:
        assert row.support_size <= top_k
    # counts are within one ticket of the exact FP64 share on the chosen support
    w = np.exp(x / temperature - np.max(x / temperature))
    if top_k is not None:
        order = np.lexsort((np.arange(len(w)), -w))[:top_k]
        mask = np.zeros(len(w), bool)
        mask[order] = True
        w = np.where(mask, w, 0.0)
    share = w / w.sum() * MASS
    assert np.all(np.abs(row.dense_counts() - share) < 1.0 + 1e-6)
    assert parse_dense(row.to_dense(), row.vocab) == row
    assert parse_sparse(*row.to_sparse(), row.vocab) == row
    whole = row.dense_q()  # a full-support row holds its FP32 q, exactly
    assert (whole is None) == (top_k is not None)
    if whole is not None:
        assert whole.dtype == np.float32
        assert np.array_equal(whole.view(np.uint32), row.to_dense().view(np.uint32))


def test_a_built_rows_dense_q_is_read_only_and_private_to_build_row():
    """The FP32 q build_row keeps for a dense REPLY cannot be written, and nothing else
    carries it: equality ignores it, a parsed or replaced row has none of its own."""
    import dataclasses

    row = build_row(np.random.default_rng(3).normal(size=200))
    whole = row.dense_q()
    with pytest.raises(ValueError):
        whole[0] = 1
    parsed = parse_dense(row.to_dense(), row.vocab)  # a writeable array: extracted
    bare = dataclasses.replace(row)
    assert parsed == row == bare
    assert parsed.dense_q() is None and bare.dense_q() is None
    assert "_dense_q" not in repr(row)
    assert "_dense_q" not in {f.name for f in dataclasses.fields(row)}
    other = build_row(np.random.default_rng(3).normal(size=200))
    object.__setattr__(other, "_dense_q", np.roll(whole, 1))
    assert other == row  # equality reads the support only: the REPLY tests catch a bad q


def test_count_of_reads_a_rows_dense_q_where_it_has_one():
    """count_of answers from the FP32 q (no search) and agrees with the support for
    every id; a planted q shows it is what was read."""
    row = build_row(np.random.default_rng(4).normal(size=500) * 3.0)
    plain = DyadicRow(row.vocab, row.ids, row.counts)
    assert [row.count_of(t) for t in range(-1, 501)] == [plain.count_of(t)
                                                          for t in range(-1, 501)]
    object.__setattr__(row, "_dense_q", np.roll(row.dense_q(), 1))
    t = int(row.ids[0])
    assert row.count_of(t + 1) == plain.count_of(t) != plain.count_of(t + 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=20), st.integers(0, MASS - 1))
def test_sample_matches_cumulative_definition(weights, u):
    counts = np.array(weights, dtype=np.int64)
    counts[-1] += MASS - counts.sum()
    if counts[-1] <= 0:
        return
    row = DyadicRow(vocab=len(counts) + 3, ids=np.arange(len(counts)), counts=counts)
    tok = sample(row, u)
    cum = np.cumsum(counts)
    assert cum[tok] > u and (tok == 0 or cum[tok - 1] <= u)
