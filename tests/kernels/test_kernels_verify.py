"""Kernel 6: the batched verification step against the rational oracle and pp1q.core.verify."""

import numpy as np
import pytest
import torch
from kernels_cases import drafts, keys, same, sampled_drafts

from pp1q.core import reference as ref
from pp1q.core import verify as fast
from pp1q.core.errors import LocalProtocolError, Reason
from pp1q_kernels import verify_step as vs
from pp1q_kernels.lookup import dense_counts

REGIMES = ["close", "far", "adversarial", "sparse", "equal"]


def make_batch(g, regime, B, D, V):
    """(p [B, D+1, V] float32, q SparseCounts [B, D], flat q rows, drafts [B, D])."""
    t_logits = g.normal(0.0, 2.0, (B, D + 1, V))
    p = torch.softmax(torch.tensor(t_logits, dtype=torch.float32), -1)
    d_logits = {
        "close": t_logits[:, :D] + g.normal(0.0, 0.3, (B, D, V)),
        "far": g.normal(0.0, 2.0, (B, D, V)),
        "adversarial": -t_logits[:, :D],  # heavy rejection (ANCHORS: shared-noise regime)
        "sparse": t_logits[:, :D],
        "equal": t_logits[:, :D],
    }[regime]
    top_k = 4 if regime == "sparse" else None
    q, rows = drafts(g, (B, D), V, top_k=top_k, logits=d_logits)
    if regime == "equal":  # p is exactly q: every draft accepted, the bonus decides
        p[:, :D] = dense_counts(q).to(torch.float32) / 2**24
    return p, q, rows, sampled_drafts(g, q)


def oracle(p, rows, draft, key, D):
    return [ref.oracle_round(list(p[b].double().numpy()), rows[b * D:(b + 1) * D], draft[b],
                             ref.RoundDraws.from_keys(key[b], D)) for b in range(len(key))]


def check_rounds(seed, rounds, B=8, D=3, V=19):
    g = np.random.default_rng(seed)
    kinds = set()
    for n in range(rounds // B):
        p, q, rows, draft = make_batch(g, REGIMES[n % len(REGIMES)], B, D, V)
        k = keys(g, B)
        sk = vs.StepKeys.from_keys(k)
        want = oracle(p, rows, draft.tolist(), k, D)
        for qq in (q, dense_counts(q)):
            got = vs.verify_step(p, qq, draft, sk).decisions(D)
            assert [(d.accepted, d.token, d.kind) for d in got] == \
                [(d.accepted, d.token, d.kind) for d in want]
            assert not any(d.residual_underflow for d in got)
        kinds |= {(d.kind, d.accepted) for d in want}
    return kinds


def test_step_equals_oracle_on_random_rounds():
    kinds = check_rounds(seed=30, rounds=400)
    assert {k for k, _ in kinds} == {"correction", "bonus"}
    assert {a for _, a in kinds} == {0, 1, 2, 3}  # every accepted count was reached


@pytest.mark.slow
def test_step_equals_oracle_on_10k_rounds():
    check_rounds(seed=31, rounds=10_000)


def test_step_equals_pp1q_verify_fast_path():
    g = np.random.default_rng(32)
    for regime in REGIMES:
        p, q, rows, draft = make_batch(g, regime, 6, 4, 33)
        k = keys(g, 6)
        got = vs.verify_step(p, q, draft, vs.StepKeys.from_keys(k)).decisions(4)
        chains = [rows[b * 4:(b + 1) * 4] for b in range(6)]
        assert got == fast.verify_batch(p.double().numpy(), chains, draft.tolist(), k)


def test_explicit_draws_path_equals_oracle_with_the_same_draws():
    g = np.random.default_rng(33)
    p, q, rows, draft = make_batch(g, "adversarial", 5, 2, 11)
    draws = [ref.RoundDraws(tuple(g.integers(0, 2**53, 2).tolist()),
                            tuple(g.integers(0, 2**53, 2).tolist()), int(g.integers(0, 2**53)))
             for _ in range(5)]
    draws[0] = ref.RoundDraws((0, 0), (0, 0), 0)
    draws[1] = ref.RoundDraws((2**53 - 1,) * 2, (2**53 - 1,) * 2, 2**53 - 1)

    def col(f):
        return torch.tensor([f(d) for d in draws])

    got = vs.decide(p, q, draft, col(lambda d: d.acceptance), col(lambda d: d.correction),
                    col(lambda d: d.bonus)).decisions(2)
    for b in range(5):
        want = ref.oracle_round(list(p[b].double().numpy()), rows[2 * b:2 * b + 2],
                                draft[b].tolist(), draws[b])
        assert (got[b].accepted, got[b].token, got[b].kind) == (want.accepted, want.token,
                                                                 want.kind)


def test_each_request_uses_its_own_seed():
    g = np.random.default_rng(34)
    p, q, _, draft = make_batch(g, "far", 6, 3, 29)
    k = keys(g, 6)
    batch = vs.verify_step(p, q, draft, vs.StepKeys.from_keys(k))
    for b in range(6):
        alone = vs.verify_step(p[b:b + 1], q.index(slice(b, b + 1)), draft[b:b + 1],
                               vs.StepKeys.from_keys([k[b]]))
        assert same(alone, vs.StepResult(batch.accepted[b:b + 1], batch.token[b:b + 1],
                                         batch.underflow[b:b + 1]))
    # planted bug: every request keyed by request 0's seed gives different decisions
    seed0 = vs.StepKeys.from_keys([type(x)(k[0].seed, x.generation, x.round_id, x.first_position)
                                   for x in k])
    assert not same(vs.verify_step(p, q, draft, seed0), batch)


def test_refusals():
    g = np.random.default_rng(35)
    p, q, _, draft = make_batch(g, "far", 2, 2, 9)
    sk = vs.StepKeys.from_keys(keys(g, 2))
    dense = dense_counts(q)
    zero = dense.clone()
    zero[0, 0, draft[0, 0]] = 0
    outside = draft.clone()
    outside[1, 1] = 9  # == vocab
    cases = [
        (lambda: vs.verify_step(p, zero, draft, sk), Reason.ZERO_Q_AT_TOKEN),
        (lambda: vs.verify_step(p, q, outside, sk), Reason.ID_OUT_OF_RANGE),
        (lambda: vs.verify_step(p[:, :2], q, draft, sk), Reason.UNEXPECTED_SIZE),
        (lambda: vs.verify_step(p, q, draft, vs.StepKeys(sk.seeds, sk.generation + (1 << 24),
                                                          sk.round_id, sk.first_position)),
         Reason.RNG_KEY_OUT_OF_RANGE),
    ]
    for call, reason in cases:
        with pytest.raises(LocalProtocolError) as e:
            call()
        assert e.value.reason == reason
