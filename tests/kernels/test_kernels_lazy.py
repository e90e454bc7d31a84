"""The lazy verification step (rows read only when a round reaches them) against the
batched one: bit-identical results on every regime, and the refusals it keeps."""

import numpy as np
import pytest
import torch
from kernels_cases import drafts, keys, same
from test_kernels_verify import REGIMES, make_batch

from pp1q.core.errors import DistributionError, LocalProtocolError, Reason
from pp1q_kernels import verify_step as vs
from pp1q_kernels.lazy_step import decide_rows
from pp1q_kernels.lookup import SparseCounts, count_at, dense_counts


def rows_of(q):
    def at(i):
        b = torch.arange(i.shape[0])
        return q.index(b, i) if isinstance(q, SparseCounts) else q[b, i]
    return at


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lazy_step_equals_the_batched_step(dtype):
    g = np.random.default_rng(50)
    work = torch.empty(0, dtype=torch.int64)
    for n in range(40):
        p, q, _, draft = make_batch(g, REGIMES[n % len(REGIMES)], 6, 4, 37)
        p = p.to(dtype)
        u = vs.step_draws(vs.StepKeys.from_keys(keys(g, 6)), 4)
        for qq in (q, dense_counts(q)):
            want = vs.decide(p, qq, draft, *u)
            got = decide_rows(list(p), count_at(qq, draft), rows_of(qq), draft, *u,
                              work=work if n % 2 else None)
            assert same(got, want)


def test_lazy_step_refuses_what_it_reads():
    g = np.random.default_rng(51)
    p, q, _, draft = make_batch(g, "adversarial", 2, 3, 11)
    u = vs.step_draws(vs.StepKeys.from_keys(keys(g, 2)), 3)
    bad = p.clone()
    bad[1, 0, 0] = float("nan")
    with pytest.raises(DistributionError) as e:
        decide_rows(list(bad), count_at(q, draft), rows_of(q), draft, *u)
    assert e.value.reason is Reason.NON_FINITE
    with pytest.raises(LocalProtocolError) as e:
        decide_rows([p[0], p[1, :2]], count_at(q, draft), rows_of(q), draft, *u)
    assert e.value.reason is Reason.UNEXPECTED_SIZE
    wide, _ = drafts(g, (2, 3), 12)
    with pytest.raises(LocalProtocolError) as e:
        decide_rows(list(p), count_at(q, draft), rows_of(wide), draft, *u)
    assert e.value.reason is Reason.UNEXPECTED_SIZE
