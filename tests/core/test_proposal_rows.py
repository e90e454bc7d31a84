"""A PROPOSAL's rows as the verifier parses them (pp1q.core.q_parse.parse_sparse_rows):
both checkers give the same rows, and the count at each proposed token that the numba
kernel finds on the way (kept on the row for the ratio test's c_x) is the row's count
there, as a search finds it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_q_backends import backend, numba_missing

from pp1q.core import q_backend
from pp1q.core.q import MASS, DyadicRow
from pp1q.core.q_parse import parse_sparse_rows
from pp1q.wire.proposal import pack_rows


@st.composite
def proposals(draw):
    """(words, entries, tokens, vocab): the payload of 1-8 honest rows, each token drawn
    from its own row's support."""
    vocab = draw(st.integers(1, 300))
    tokens, rows = [], []
    for _ in range(draw(st.integers(1, 8))):
        n = draw(st.integers(1, min(vocab, 32)))
        ids = sorted(draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n,
                                   unique=True)))
        cuts = sorted(draw(st.lists(st.integers(1, MASS - 1), min_size=n - 1,
                                    max_size=n - 1, unique=True)))
        counts = np.diff([0, *cuts, MASS])
        rows.append(DyadicRow(vocab, np.array(ids, np.int32), counts))
        tokens.append(ids[draw(st.integers(0, n - 1))])
    words, entries, _ = pack_rows(tokens, rows)
    return words, entries, tokens, vocab


def _parsed(case, name: str) -> list[DyadicRow]:
    words, entries, tokens, vocab = case
    with backend(name):
        return parse_sparse_rows(words, entries, tokens, vocab)


def _check_counts_at_tokens(case, rows) -> None:
    for row, token in zip(rows, case[2], strict=True):
        searched = DyadicRow(row.vocab, row.ids.copy(), row.counts.copy())  # nothing kept
        assert row.count_of(token) == searched.count_of(token) > 0
        assert row.require_token(token) == searched.count_of(token)


@pytest.mark.experiment
@numba_missing
@settings(max_examples=300, deadline=None)
@given(proposals())
def test_both_checkers_parse_a_proposal_alike_and_keep_the_true_count_at_each_token(case):
    fused, plain = _parsed(case, "numba"), _parsed(case, "numpy")
    assert fused == plain  # ids and counts
    _check_counts_at_tokens(case, fused)
    _check_counts_at_tokens(case, plain)
    assert [r._drawn for r in fused] == [(t, r.counts[r.ids.searchsorted(t)])
                                         for r, t in zip(fused, case[2], strict=True)]


class _OffByOne:
    """A planted bug in the kernel seam parse_sparse_rows reads (q_backend.kernels_for):
    each row's count at its token kept one count too high (c_x + 1)."""

    def __init__(self, k) -> None:
        self._k = k

    def __getattr__(self, name):
        return getattr(self._k, name)

    def sparse_rows(self, words, qwords, entries, tokens, vocab, counts, at_token):
        out = self._k.sparse_rows(words, qwords, entries, tokens, vocab, counts, at_token)
        at_token += 1
        return out


@numba_missing
def test_the_count_check_rejects_a_kernel_that_keeps_the_wrong_count(monkeypatch):
    vocab, ids = 64, np.array([3, 9, 40], np.int32)
    row = DyadicRow(vocab, ids, np.array([MASS // 4, MASS // 4, MASS // 2]))
    words, entries, _ = pack_rows([9], [row])
    case = (words, entries, [9], vocab)
    _check_counts_at_tokens(case, _parsed(case, "numba"))  # the real kernel passes
    real = q_backend.kernels_for
    monkeypatch.setattr(q_backend, "kernels_for", lambda *a: _OffByOne(real(*a)))
    with pytest.raises(AssertionError):
        _check_counts_at_tokens(case, _parsed(case, "numba"))
