"""The fused numba checks of q rows (dense and sparse) and numpy's passes decide alike:
the same rows accepted (and parsed to the same counts), the same closed-set Reason for
every refused row, over a corpus of bad rows (each with its expected reason, so both
being wrong the same way fails too) and over random rows (hypothesis). The choice of backend goes
through its one seam, the PP1Q_VALIDATE variable read by pp1q.core.q_backend."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pp1q.core import backend_choice, q_backend
from pp1q.core.errors import ConfigError, Reason, RowValidationError
from pp1q.core.q import MASS, build_row, parse_dense, parse_sparse, validate_dense
from pp1q.wire import Form, Step
from pp1q.wire.reply_rows import reply_from_row
from pp1q.wire.validate import check_reply

numba_missing = pytest.mark.skipif(q_backend.importlib.util.find_spec("numba") is None,
                                   reason="numba not installed (the fast extra)")
BACKENDS = ["numpy", pytest.param("numba", marks=numba_missing)]
F32 = np.float32
TINY = F32(2.0**-24)  # one count


@contextmanager
def backend(name: str):
    """Choose ``name`` as a daemon would: through PP1Q_VALIDATE, chosen afresh."""
    saved_env, saved = os.environ.get(q_backend.ENV), q_backend.CHOICE._chosen
    os.environ[q_backend.ENV] = name
    q_backend.CHOICE._chosen = None
    try:
        assert q_backend.backend() == name
        yield
    finally:
        q_backend.CHOICE._chosen = saved
        if saved_env is None:
            del os.environ[q_backend.ENV]
        else:
            os.environ[q_backend.ENV] = saved_env


def outcome(q, vocab: int):
    """('ok', ids, counts) or ('refused', reason): parse_dense and validate_dense agree."""
    try:
        validate_dense(q, vocab)
    except RowValidationError as e:
        with pytest.raises(RowValidationError) as again:
            parse_dense(q, vocab)
        assert again.value.reason == e.reason
        return ("refused", e.reason)
    row = parse_dense(q, vocab)
    return ("ok", row.ids.tolist(), row.counts.tolist())


def both(q, vocab: int):
    got = {}
    for name in ("numpy", "numba"):
        with backend(name):
            got[name] = outcome(q, vocab)
    assert got["numpy"] == got["numba"], got
    return got["numpy"]


def _bits(q: np.ndarray, i: int, b: int) -> np.ndarray:
    q = q.copy()
    q.view(np.uint32)[i] = b
    return q


V = 257  # odd: the kernel's vector loop has a remainder


def corpus():
    """(name, q, vocab, expected: None for accepted, else the Reason)."""
    row = build_row(np.random.default_rng(3).normal(size=V) * 3.0, temperature=0.9)
    q = row.to_dense()
    pos = int(row.ids[row.counts.argmax()])  # an entry holding many counts
    small = int(row.ids[row.counts.argmin()])  # its FP32 ulp is far below one count
    zero = int(np.flatnonzero(q == 0)[0])
    last = V - 1
    pad = np.concatenate([q, np.zeros(11, F32)])

    def put(i, v, base=q):
        out = base.copy()
        out[i] = v
        return out

    moved = put(pos, q[pos] - TINY)
    odd = put(zero, F32(2.0**-30))  # non-dyadic, and the mass is off too
    one = np.zeros(V, F32)
    one[last] = 1
    cases = [
        ("valid", q, None),
        ("valid, zero padding", pad, None),
        ("all mass on the last id", one, None),
        ("one count on an id", put(pos, q[pos] - TINY, put(zero, TINY)), None),
        ("NaN", put(7, np.nan), Reason.NON_FINITE),
        ("negative NaN", _bits(q, 9, 0xFFC00001), Reason.NON_FINITE),
        ("+inf", put(last, np.inf), Reason.NON_FINITE),
        ("-inf", put(0, -np.inf), Reason.NON_FINITE),
        ("negative", put(pos, -q[pos]), Reason.NEGATIVE_VALUE),
        ("-0.0", put(zero, F32(-0.0)), Reason.NEGATIVE_VALUE),
        ("smallest negative subnormal", _bits(q, zero, 0x80000001), Reason.NEGATIVE_VALUE),
        ("1.5", put(pos, 1.5), Reason.WRONG_MASS),
        ("just above 1", put(pos, np.nextafter(F32(1), F32(2))), Reason.WRONG_MASS),
        ("1.0 plus the rest", put(pos, 1.0), Reason.WRONG_MASS),
        ("smallest subnormal", _bits(q, zero, 1), Reason.NON_DYADIC),
        ("largest subnormal", _bits(q, zero, 0x007FFFFF), Reason.NON_DYADIC),
        ("smallest normal", _bits(q, zero, 0x00800000), Reason.NON_DYADIC),
        ("2^-25", put(zero, F32(2.0**-25)), Reason.NON_DYADIC),
        ("next after a count", put(small, np.nextafter(q[small], F32(1))), Reason.NON_DYADIC),
        ("1/3", put(pos, F32(1 / 3)), Reason.NON_DYADIC),
        ("one count short", moved, Reason.WRONG_MASS),
        ("one count over", put(pos, q[pos] + TINY), Reason.WRONG_MASS),
        ("all zero", np.zeros(V, F32), Reason.WRONG_MASS),
        ("padding holds a count", put(V + 3, TINY, np.concatenate([moved, pad[V:]])),
         Reason.PADDING_NONZERO),
        ("padding holds NaN", put(V + 10, np.nan, pad), Reason.NON_FINITE),
        ("padding holds -0.0", put(V, F32(-0.0), pad), Reason.NEGATIVE_VALUE),
        ("padding holds a subnormal", _bits(pad, V + 1, 1), Reason.PADDING_NONZERO),
        # several faults: the numpy path's order of checks decides the reason
        ("non-dyadic first, NaN later", put(last, np.nan, odd), Reason.NON_FINITE),
        ("negative first, NaN later", put(last, np.nan, put(1, F32(-0.5))),
         Reason.NEGATIVE_VALUE),
        ("NaN first, negative later", put(last, F32(-0.5), put(1, np.nan)), Reason.NON_FINITE),
        ("non-dyadic and nonzero padding", put(V + 2, TINY, np.concatenate([odd, pad[V:]])),
         Reason.PADDING_NONZERO),
        ("non-dyadic and wrong mass", odd, Reason.NON_DYADIC),
        ("> 1 in the row, NaN in the padding", put(V + 4, np.nan, put(2, 2.0, pad)),
         Reason.WRONG_MASS),
        ("too short", q[:-1], Reason.UNEXPECTED_SIZE),
    ]
    return [(name, a, V, want) for name, a, want in cases]


@numba_missing
@pytest.mark.parametrize("name,q,vocab,want", corpus(), ids=[c[0] for c in corpus()])
def test_both_backends_decide_each_bad_row_alike(name, q, vocab, want):
    got = both(q, vocab)
    assert got[0] == ("ok" if want is None else "refused")
    if want is not None:
        assert got[1] == want
    assert both(q.tobytes(), vocab) == got  # read-only little-endian bytes, as a capture


@numba_missing
def test_full_vocabulary_rows_and_odd_layouts():
    vocab = 129280
    row = build_row(np.random.default_rng(5).normal(size=vocab) * 3.0, temperature=0.8)
    q = row.to_dense()
    assert both(q, vocab) == ("ok", row.ids.tolist(), row.counts.tolist())
    for where in (0, 1, 15, 16, 64_000, vocab - 1):  # vector lanes, the loop's tail
        assert both(_bits(q, where, 0x7FC00000), vocab) == ("refused", Reason.NON_FINITE)
        bad = q.copy()
        bad[where] += F32(2.0**-30) if bad[where] else F32(2.0**-25)
        assert both(bad, vocab) == ("refused", Reason.NON_DYADIC)
    strided = np.zeros(2 * 300, F32)[::2]  # not contiguous: the numpy path, same decision
    strided[5] = 1.0
    assert both(strided, 300)[0] == "ok"
    assert both(bytearray(q.tobytes()), vocab)[0] == "ok"
    swapped = q.astype(">f4")  # not native here: the numpy path (as_array refuses it anyway)
    assert both(swapped, vocab) == ("refused", Reason.UNEXPECTED_SIZE)


def _valid_counts(draw, vocab: int) -> np.ndarray:
    cuts = sorted(draw(st.lists(st.integers(0, MASS), min_size=vocab - 1,
                                max_size=vocab - 1)))
    return np.diff(np.array([0, *cuts, MASS], np.int64))


@st.composite
def rows(draw):
    vocab = draw(st.integers(1, 70))
    q = (_valid_counts(draw, vocab).astype(F32) / F32(MASS)).astype(F32)
    q = np.concatenate([q, np.zeros(draw(st.integers(0, 9)), F32)])
    bits = q.view(np.uint32)
    for i, b in draw(st.lists(st.tuples(st.integers(0, q.size - 1), st.one_of(
            st.integers(0, 2**32 - 1),  # any bit pattern
            st.sampled_from([0, 1, 0x33800000, 0x33000000, 0x3F800000, 0x80000000,
                             0x7F800000, 0x7FC00000, 0xBF800000]),  # edges
            st.integers(0, MASS).map(lambda c: int(F32(c / MASS).view(np.uint32))))),
            max_size=3)):
        bits[i] = b
    return q, vocab


@pytest.mark.experiment
@numba_missing
@settings(max_examples=400, deadline=None)
@given(rows())
def test_random_rows_decide_alike(case):
    q, vocab = case
    both(q, vocab)


def sparse_outcome(ids, q, vocab: int):
    try:
        row = parse_sparse(ids, q, vocab)
    except RowValidationError as e:
        return ("refused", e.reason)
    return ("ok", row.ids.tolist(), row.counts.tolist())


def both_sparse(ids, q, vocab: int):
    got = {}
    for name in ("numpy", "numba"):
        with backend(name):
            got[name] = sparse_outcome(ids, q, vocab)
    assert got["numpy"] == got["numba"], got
    return got["numpy"]


def sparse_corpus():
    h = F32(0.5)
    ids, q = [3, 9, 40], [F32(0.25), F32(0.25), h]
    odd = [F32(0.25), F32(2.0**-30), h]

    def at(i, v, base=q):
        out = list(base)
        out[i] = v
        return out

    return [
        ("valid", ids, q, None),
        ("one id, all mass", [63], [F32(1)], None),
        ("id below 0", [-1, 9, 40], q, Reason.ID_OUT_OF_RANGE),
        ("id at vocab", [3, 9, 64], q, Reason.ID_OUT_OF_RANGE),
        ("out of range beats duplicate", [3, 3, 64], q, Reason.ID_OUT_OF_RANGE),
        ("duplicate", [3, 3, 40], q, Reason.DUPLICATE_ID),
        ("duplicate zeros", [0, 1, 1], [F32(1), F32(0), F32(0)], Reason.DUPLICATE_ID),
        ("unsorted", [9, 3, 40], q, Reason.UNSORTED_SUPPORT),
        ("unsorted first, duplicate later", [9, 3, 3], q, Reason.DUPLICATE_ID),
        ("unsorted and NaN", [9, 3, 40], at(0, np.nan), Reason.UNSORTED_SUPPORT),
        ("NaN", ids, at(1, np.nan), Reason.NON_FINITE),
        ("-inf", ids, at(2, -np.inf), Reason.NON_FINITE),
        ("negative", ids, at(0, F32(-0.25)), Reason.NEGATIVE_VALUE),
        ("-0.0", ids, at(0, F32(-0.0)), Reason.NEGATIVE_VALUE),
        ("above 1", ids, at(2, F32(1.5)), Reason.WRONG_MASS),
        ("non-dyadic", ids, odd, Reason.NON_DYADIC),
        ("subnormal", ids, at(1, np.frombuffer(np.uint32(1).tobytes(), F32)[0]),
         Reason.NON_DYADIC),
        ("non-dyadic first, NaN later", ids, at(2, np.nan, odd), Reason.NON_FINITE),
        ("mass short", ids, at(2, F32(0.25)), Reason.WRONG_MASS),
        ("zero q in the support", [3, 9, 40], [F32(0.5), F32(0), h], Reason.NON_CANONICAL),
        ("zero q and wrong mass", [3, 9, 40], [F32(0.25), F32(0), h], Reason.WRONG_MASS),
        ("empty", [], [], Reason.MISSING_Q),
        ("lengths differ", ids, q[:2], Reason.UNEXPECTED_SIZE),
    ]


@numba_missing
@pytest.mark.parametrize("name,ids,q,want", sparse_corpus(), ids=[c[0] for c in sparse_corpus()])
def test_both_backends_decide_each_bad_sparse_row_alike(name, ids, q, want):
    ids, q = np.array(ids, np.int32), np.array(q, F32)
    got = both_sparse(ids, q, 64)
    assert got[0] == ("ok" if want is None else "refused")
    if want is not None:
        assert got[1] == want
    assert both_sparse(ids.tobytes(), q.tobytes(), 64) == got  # as frames carry them


@st.composite
def sparse_rows(draw):
    vocab = draw(st.integers(1, 200))
    n = draw(st.integers(1, min(vocab, 40)))
    ids = sorted(draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n,
                               unique=True)))
    counts = _valid_counts(draw, n)
    q = (counts.astype(F32) / F32(MASS)).astype(F32)
    ids = np.array(ids, np.int32)
    for i, v in draw(st.lists(st.tuples(st.integers(0, n - 1),
                                        st.integers(-3, vocab + 2)), max_size=2)):
        ids[i] = v  # out of range, duplicate or unsorted
    bits = q.view(np.uint32)
    for i, b in draw(st.lists(st.tuples(st.integers(0, n - 1), st.one_of(
            st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 0x3F800000, 0x80000000])
    )), max_size=2)):
        bits[i] = b
    return ids, q, vocab


@pytest.mark.experiment
@numba_missing
@settings(max_examples=400, deadline=None)
@given(sparse_rows())
def test_random_sparse_rows_decide_alike(case):
    both_sparse(*case)


@numba_missing
@pytest.mark.parametrize("name", BACKENDS)
def test_zero_q_at_the_proposed_token_is_refused(name):
    row = build_row(np.random.default_rng(4).normal(size=V) * 3.0, temperature=0.9)
    step = Step(session=1, slot=0, generation=1, round_id=1, last_committed=4,
                first_position=5, prefix_digest=0, depth=1, temperature=0.9, top_k=0,
                context_version=0, seed=1)
    zero = int(np.flatnonzero(row.to_dense() == 0)[0])
    reply = reply_from_row(session=1, slot=0, generation=1, round_id=1, index=1,
                           position=5, token=int(row.ids[0]), row=row, form=Form.DENSE)
    with backend(name):
        assert check_reply(reply, step, V) is None
        with pytest.raises(RowValidationError) as e:  # a peer's reply: no local check ran
            check_reply(msgspec.structs.replace(reply, token=zero), step, V)
        assert e.value.reason == Reason.ZERO_Q_AT_TOKEN


def test_the_variable_chooses_and_a_bad_value_is_refused(monkeypatch):
    monkeypatch.setattr(q_backend.CHOICE, "_chosen", None)
    monkeypatch.setenv(q_backend.ENV, "numpy")
    assert q_backend.chosen()[::2] == ("numpy", None)
    for bad in ("fast", "numba,numpy"):
        monkeypatch.setattr(q_backend.CHOICE, "_chosen", None)
        monkeypatch.setenv(q_backend.ENV, bad)
        with pytest.raises(ConfigError, match="PP1Q_VALIDATE"):
            q_backend.backend()


def test_numba_asked_for_but_missing_is_refused_not_replaced(monkeypatch):
    """auto falls back to numpy (and says why); numba named explicitly never does."""
    monkeypatch.setattr(backend_choice.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(q_backend.CHOICE, "_chosen", None)
    monkeypatch.setenv(q_backend.ENV, "auto")
    assert q_backend.chosen() == ("numpy", "numba not installed", None)
    monkeypatch.setattr(q_backend.CHOICE, "_chosen", None)
    monkeypatch.setenv(q_backend.ENV, "numba")
    with pytest.raises(ConfigError, match="numba is not installed"):
        q_backend.backend()


@numba_missing
def test_the_kernels_check_their_own_bounds():
    """Bounds checking is off inside the loops: each kernel refuses sizes that would
    read past an array (the callers check first; this is the second line)."""
    from pp1q.core import q_scan

    q = np.zeros(8, F32)
    bits = q.view(np.uint32)
    for call in (lambda: q_scan.scan(q, bits, 9), lambda: q_scan.extract(q, bits, 9),
                 lambda: q_scan.scan(q[:4], bits, 4),
                 lambda: q_scan.sparse(np.arange(9, dtype=np.int32), q, 64, -1,
                                       np.empty(9, np.int64)),
                 lambda: q_scan.sparse(np.arange(8, dtype=np.int32), q, 64, -1,
                                       np.empty(7, np.int64)),
                 lambda: q_scan.sparse(np.arange(0, dtype=np.int32), q[:0], 64, -1,
                                       np.empty(0, np.int64)),
                 lambda: q_scan.copy_scan(bits[:4], np.zeros(8, np.uint32)),
                 lambda: q_scan.scatter(q, np.array([0, 8], np.int32), np.ones(2, np.int64)),
                 lambda: q_scan.scatter(q, np.array([-1], np.int32), np.ones(1, np.int64)),
                 lambda: q_scan.scatter(q, np.arange(2, dtype=np.int32), np.ones(3, np.int64)),
                 lambda: q_scan.dense_from_counts(q, np.ones(9, np.int32))):
        with pytest.raises(ValueError):
            call()


@pytest.mark.parametrize("name", BACKENDS)
def test_build_row_is_the_checked_row_on_every_backend(name):
    """build_row skips the constructor's checks (its rows hold them by construction) and
    reads a full-support row's support from the FP32 q it wrote (numba's extract or
    numpy's): the row is the one the checking constructor makes from the allocation's
    counts, int32 ids and int64 counts, with q bit for bit count / 2^24; -inf logits
    (zero counts inside the vocabulary) and top-k rows included."""
    from pp1q.core import q as q_module
    from pp1q.core.q import DyadicRow

    g = np.random.default_rng(63)
    with backend(name):
        for n in range(15):
            logits = g.normal(size=(1, 2, 255, 256, 3000)[n % 5]) * (0.5, 3.0, 60.0)[n % 3]
            if n % 4 == 3:
                logits[g.integers(logits.size, size=logits.size // 3)] = -np.inf
                logits[0] = 0.0  # at least one finite logit
            top_k = 7 if n % 5 == 4 else None
            row = build_row(logits, top_k=top_k)
            w = q_module._weights(logits, 1.0)
            if top_k is not None:
                support = q_module._top_k_ids(w, top_k)
                w = w[support] / w[support].sum()
            counts = q_module._allocate(w)
            ids = np.flatnonzero(counts > 0)
            checked = DyadicRow(row.vocab, ids if top_k is None else support[ids],
                                counts[ids])
            assert row == checked
            assert row.ids.dtype == np.int32 and row.counts.dtype == np.int64
            whole = row.dense_q()
            assert (whole is None) == (top_k is not None)
            if whole is not None:
                assert np.array_equal(whole.view(np.uint32), checked.to_dense().view(np.uint32))


@pytest.mark.parametrize("name", BACKENDS)
def test_dense_replies_from_the_reused_row_are_byte_identical(name):
    """The worker's dense REPLY (a reused zero row, written by numba's scatter or numpy's
    store) is byte for byte the one built from a fresh row, through wide supports
    (memset clear), narrow ones (indexed clear) and a change of row length."""
    from pp1q.wire.framing import encode
    from pp1q.wire.pool import ZeroRow

    g = np.random.default_rng(61)
    with backend(name):
        reused = ZeroRow()
        for n in range(14):
            top_k = None if n % 2 else int(g.integers(1, 40))
            row = build_row(g.normal(size=300) * (1.0 if n % 3 else 40.0), top_k=top_k)
            dense_len = 320 if n < 10 else 300
            frames = [encode(reply_from_row(
                session=1, slot=0, generation=1, round_id=1, index=1, position=1,
                token=int(row.ids[-1]), row=row, form=Form.DENSE, dense_len=dense_len,
                dense_row=dense_row)) for dense_row in (reused, None)]
            assert frames[0] == frames[1]


@pytest.mark.parametrize("name", BACKENDS)
def test_dense_replies_of_a_built_q_equal_the_scatter_bit_for_bit(name):
    """A row that keeps its FP32 q (build_row's, full support) is sent as it is when the
    frame is as long as the row, copied over a reused row with zero padding when it is
    longer; the same row without it (dataclasses.replace keeps none) is scattered into
    zeros, and a fresh row is the plain store: the three REPLYs are the same bytes, and
    the q is row.to_dense() bit for bit with zero padding, over narrow and wide
    supports, top-k rows between (a scatter after a whole write must clear it all) and
    a change of row length."""
    import dataclasses

    from pp1q.wire.framing import encode
    from pp1q.wire.pool import ZeroRow

    g = np.random.default_rng(62)
    with backend(name):
        whole, scattered = ZeroRow(), ZeroRow()
        for n in range(18):
            top_k = int(g.integers(1, 40)) if n % 4 == 3 else None
            row = build_row(g.normal(size=300) * (0.5, 3.0, 60.0)[n % 3],
                            temperature=float(g.uniform(0.3, 2.0)), top_k=top_k)
            bare = dataclasses.replace(row)
            assert (row.dense_q() is None) == (top_k is not None)
            assert bare.dense_q() is None
            dense_len = 320 if n < 12 else 300

            def reply(r, dense_row, dense_len=dense_len, row=row):
                return reply_from_row(session=1, slot=0, generation=1, round_id=1, index=1,
                                      position=1, token=int(row.ids[-1]), row=r,
                                      form=Form.DENSE, dense_len=dense_len,
                                      dense_row=dense_row)

            q = reply(row, whole).q
            # a row's own q of the frame's length is sent as it is; padded, it is copied
            sent_as_built = top_k is None and dense_len == 300
            assert (q is row.dense_q()) == sent_as_built
            assert np.array_equal(q[:300].view(np.uint32), row.to_dense().view(np.uint32))
            assert not q[300:].view(np.uint32).any()
            frames = [encode(reply(r, z)) for r, z in ((row, whole), (bare, scattered),
                                                        (row, None))]
            assert frames[0] == frames[1] == frames[2]


@numba_missing
def test_warm_up_loads_the_kernels():
    with backend("numba"):
        name, why, seconds = q_backend.warm_up()
        assert name == "numba" and why == "PP1Q_VALIDATE=numba" and seconds >= 0


@pytest.mark.daemons
def test_a_daemon_with_a_bad_choice_refuses_to_start_with_one_line():
    """The daemons choose (and load) the checker before serving: a bad PP1Q_VALIDATE
    ends the start with status 2 and one line, like any other setting."""
    env = {**os.environ, q_backend.ENV: "fastest"}
    r = subprocess.run([sys.executable, "-m", "pp1q.cli", "worker", "--vocab", "16",
                        "--speculation", "sampled", "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "pp1q worker: PP1Q_VALIDATE='fastest': must be one of auto, numba, numpy"]


@numba_missing
def test_sparse_rows_with_a_proposed_token_decide_alike():
    """parse_sparse(..., token): the numba path folds require_token into its one kernel
    call; both paths refuse alike, the row's own fault before the token's."""
    ids, q = np.array([3, 9, 40], np.int32), np.array([0.25, 0.25, 0.5], F32)
    bad_q = q.copy()
    bad_q[1] = np.nan
    cases = [(ids, q, 9, None), (ids, q, 3, None), (ids, q, 40, None),
             (ids, q, 4, Reason.ZERO_Q_AT_TOKEN), (ids, q, 0, Reason.ZERO_Q_AT_TOKEN),
             (ids, q, 63, Reason.ZERO_Q_AT_TOKEN), (ids, q, 64, Reason.ID_OUT_OF_RANGE),
             (ids, q, -1, Reason.ID_OUT_OF_RANGE),
             (ids, bad_q, 4, Reason.NON_FINITE),  # the row's reason first
             (ids[::-1].copy(), q, 4, Reason.UNSORTED_SUPPORT)]
    for i, qq, token, want in cases:
        got = {}
        for name in ("numpy", "numba"):
            with backend(name):
                try:
                    row = parse_sparse(i, qq, 64, token)
                    got[name] = ("ok", row.counts.tolist())
                except RowValidationError as e:
                    got[name] = ("refused", e.reason)
        assert got["numpy"] == got["numba"], (token, got)
        assert got["numpy"][0] == ("ok" if want is None else "refused")
        if want is not None:
            assert got["numpy"][1] == want


@numba_missing
@pytest.mark.parametrize("name,q,vocab,want", corpus(), ids=[c[0] for c in corpus()])
def test_copy_scanned_copies_exactly_and_passes_only_rows_the_scan_passes(name, q, vocab, want):
    """copy_scanned (the decoder's copy of a dense payload) copies every byte under both
    checkers, from any alignment; under numba its pass means validate_dense(checked=True)
    accepts exactly the rows validate_dense accepts, with the same reason otherwise."""
    for at in (0, 1, 3):  # where a payload starts in the bytes fed
        fed = memoryview(bytes(at) + q.tobytes())[at:]
        for name_ in ("numpy", "numba"):
            with backend(name_):
                dst = np.full(q.nbytes, 0xAB, np.uint8)
                passed = q_backend.copy_scanned(dst, fed)
                assert dst.tobytes() == q.tobytes()
                assert passed is False or name_ == "numba"
                arr = dst.view(F32)
                try:
                    validate_dense(arr, vocab, checked=passed)
                    got = None
                except RowValidationError as e:
                    got = e.reason
                assert got == want, (name_, at, passed)
