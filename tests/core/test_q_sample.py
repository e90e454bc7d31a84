"""``pp1q.core.q.sample`` over a whole vocabulary: a received dense row read in place (its
FP32 q) and a full-support row build_row built (its FP32 q too) are drawn from by one kernel pass
(pp1q.core.q_scan.first_past); every form of the same row gives the same id as the
cumulative search over its support, draws on every cumulative boundary included."""

from __future__ import annotations

import numpy as np
import pytest
from test_q_backends import BACKENDS, backend, numba_missing

from pp1q.core import q_backend
from pp1q.core.q import MASS, DyadicRow, build_row, dense_row_of_valid, sample, validate_dense


def forms(row: DyadicRow) -> dict[str, DyadicRow]:
    """The same q as a plain row (support only), as build_row built it (its FP32 q over
    the vocabulary) and as a verifier holds a received dense REPLY (FP32, read-only, in
    place)."""
    q = row.to_dense()
    q.flags.writeable = False
    received = dense_row_of_valid(validate_dense(q, row.vocab), row.vocab)
    assert row.dense_q() is not None and received.dense_q() is not None
    return {"plain": DyadicRow(row.vocab, row.ids.copy(), row.counts.copy()), "built": row,
            "received": received}


def boundary_draws(row: DyadicRow, g) -> list[int]:
    """0, MASS - 1, each cumulative count and one below it (a draw equal to a cumulative
    count takes the next id), and random draws."""
    cum = np.cumsum(row.counts)[:-1]
    pick = g.choice(cum, size=min(cum.size, 40), replace=False) if cum.size else cum
    return sorted({0, MASS - 1, *map(int, pick), *(int(c) - 1 for c in pick),
                   *map(int, g.integers(0, MASS, 40))})


def search(row: DyadicRow, u24: int) -> int:
    """The rule itself: the first id whose cumulative count exceeds u24."""
    return int(row.ids[np.searchsorted(np.cumsum(row.counts), u24, side="right")])


def differences(g, vocabs=(1, 2, 255, 256, 257, 3000)) -> list[tuple]:
    out = []
    for vocab in vocabs:
        for scale in (0.5, 3.0, 12.0):  # flat to a few dominant ids (many zero counts)
            row = build_row(g.normal(size=vocab) * scale)
            for name, form in forms(row).items():
                out += [(vocab, name, u) for u in boundary_draws(row, g)
                        if sample(form, u) != search(row, u)]
    return out


@pytest.mark.parametrize("name", BACKENDS)
def test_every_form_draws_the_id_the_cumulative_search_gives(name):
    with backend(name):
        assert differences(np.random.default_rng(90)) == []


class _OneEarly:
    """A planted bug in the kernel seam sample reads (q_backend.kernels_for): the draw
    stops where the running sum reaches u, not where it exceeds it."""

    def __init__(self, k) -> None:
        self._k = k

    def __getattr__(self, name):
        return getattr(self._k, name)

    def first_past(self, values, scale, u):
        return self._k.first_past(values, scale, u - 1)


@numba_missing
def test_a_kernel_that_stops_one_count_early_is_caught(monkeypatch):
    with backend("numba"):
        real = q_backend.kernels_for
        monkeypatch.setattr(q_backend, "kernels_for", lambda *a: _OneEarly(real(*a)))
        found = differences(np.random.default_rng(91), vocabs=(257,))
    assert found and {name for _, name, _ in found} == {"built", "received"}
