"""Output distribution of whole rounds: a per-position goodness-of-fit test, and planted bugs.

Each trial is one round with its own keys (round id = trial index): the worker samples
x_i from q_i with the PROPOSAL draw, the float64 reference (pp1q.core.verify.decide) runs on the
ACCEPTANCE / CORRECTION / BONUS draws. Target rows are fixed per position (different
from one position to the next), so, given that a round's output reaches position j,
the token there must be distributed as p_j, whatever happened before (the draws of
position j are independent of the earlier ones). Each position is checked with
stats.g_test (G read at the 1e-7 quantile: false alarms under 1e-6; bins with expected
< 5 merged; fixed seeds).

Planted bugs (each must be rejected by the same check):
 (a) correction reuses the acceptance draw, or the proposal draw (vLLM PR #54282);
 (b) residual taken on the sparse support only; (b') residual normalised by softmax;
 (c) q row of position i used at i+1; (d) bonus drawn from p_depth;
 (e) selective admission of x_1 after seeing it; (f) q sent is not the q that sampled;
 (g) target processors (T = 0.7, top-p 0.9) applied to target-only sampling but not to
     the round's p (the "processed" regime's p is what target-only sampling gives).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stats import FitTest, g_test, threshold

from pp1q.core import verify
from pp1q.core.q import MASS, build_row, sample
from pp1q.core.rng import Domain, draw_words, proposal_u24, u24_from_words, u53_from_words
from pp1q.core.verify import DenseQ, decide
from pp1q.models.processors import processed_probs

pytestmark = pytest.mark.experiment  # many-round goodness-of-fit runs

SEED = 0x5EED_0001
GEN = 1
FIRST_POSITION = 1000
DEPTH = 5
TRIALS = 200_000  # the regime that caught vLLM's shared-noise bug needs this many


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class Round:
    """One regime: fixed target rows p [D+1, V], q rows that sample, q rows sent."""

    def __init__(self, p, q_sampling, q_sent=None, p_unprocessed=None):
        self.p = np.asarray(p, dtype=np.float64)
        self.p_unprocessed = p_unprocessed  # the target row before its processors
        self.q_sampling = q_sampling
        self.q_sent = q_sampling if q_sent is None else q_sent
        self.depth = len(q_sampling)
        self.vocab = self.p.shape[1]


def _draws(trials: int, depth: int):
    rounds = np.arange(trials, dtype=np.int64)[:, None]
    pos = FIRST_POSITION + np.arange(depth + 1)[None, :]

    def words(domain, positions):
        return draw_words(SEED, GEN, rounds, positions, domain)

    prop = u24_from_words(words(Domain.PROPOSAL, pos[:, :depth]))
    acc = u53_from_words(words(Domain.ACCEPTANCE, pos[:, :depth]))
    corr = u53_from_words(words(Domain.CORRECTION, pos[:, :depth]))
    bonus = u53_from_words(words(Domain.BONUS, pos[:, depth:]))[:, 0]
    return prop, acc, corr, bonus


def _sample_many(row, u24):
    """pp1q.core.q.sample, vectorised over draws (same rule: first cumulative count > u24)."""
    return row.ids[np.searchsorted(np.cumsum(row.counts), u24, side="right")].astype(np.int64)


def simulate(rnd: Round, trials: int, bug: str | None = None) -> np.ndarray:
    """Output tokens [trials, D+1] (-1 where the round stopped earlier)."""
    D, V = rnd.depth, rnd.vocab
    prop, acc, corr, bonus = _draws(trials, D)
    drafts = np.stack([_sample_many(rnd.q_sampling[i], prop[:, i]) for i in range(D)], axis=1)
    p = rnd.p
    q_dense = np.stack([r.dense_counts() for r in rnd.q_sent])
    if bug == "a_acceptance_noise":
        corr = acc
    elif bug == "a_proposal_noise":
        corr = prop << 29  # the proposal's 24 bits scaled to 53
    elif bug == "c_shifted_q":
        q_dense = np.concatenate([q_dense[:1], q_dense[:-1]])
    elif bug == "d_bonus_from_p_depth":
        p = np.concatenate([p[:D], p[D - 1: D]])
    elif bug == "g_processors_one_path":
        p = rnd.p_unprocessed
    accepted, token, _ = decide(
        np.broadcast_to(p, (trials, D + 1, V)),
        DenseQ(np.broadcast_to(q_dense, (trials, D, V))),
        drafts, acc, corr, bonus,
    )
    out = _outputs(drafts, accepted, token)
    if bug == "e_selective_admission":
        # admit x_1 only when it is the draft's favourite token; otherwise discard the
        # proposal and sample position 1 target-only from p_1
        favourite = int(rnd.q_sampling[0].ids[np.argmax(rnd.q_sampling[0].counts)])
        redo = drafts[:, 0] != favourite
        u = u53_from_words(draw_words(SEED, GEN, np.arange(trials), FIRST_POSITION,
                                      Domain.TARGET_ONLY))
        out[redo] = -1
        out[redo, 0] = verify.pick(np.broadcast_to(p[0], (int(redo.sum()), V)), u[redo])
    return out


def _outputs(drafts, accepted, token):
    """Round outputs [T, D+1]: accepted drafts, then the correction/bonus, then -1."""
    trials, depth = drafts.shape
    j = np.arange(depth + 1)[None, :]
    out = np.where(j < accepted[:, None], np.pad(drafts, ((0, 0), (0, 1))), -1)
    out[np.arange(trials), accepted] = token
    return out


def position_tests(rnd: Round, out: np.ndarray):
    """The G test (tests/support/stats.py) of each output position against its target row."""
    results = []
    for j in range(rnd.depth + 1):
        tok = out[:, j][out[:, j] >= 0]
        results.append(g_test(np.bincount(tok, minlength=rnd.vocab), rnd.p[j]))
    return results


def _check(rnd: Round, trials: int = TRIALS, bug: str | None = None):
    res = position_tests(rnd, simulate(rnd, trials, bug))
    return res, any(r.rejected for r in res)


# ---------------------------------------------------------------------------
# regimes


def _target_logits(vocab: int, seed: int, scale: float = 1.5):
    return np.random.default_rng(seed).normal(size=(DEPTH + 1, vocab)) * scale


def negated_round() -> Round:
    """vocab 16, draft logits = -target logits: heavy rejection at every position."""
    t = _target_logits(16, 1)
    return Round(_softmax(t), [build_row(-t[i]) for i in range(DEPTH)])


def sparse_round() -> Round:
    """top-4 q on a draft that disagrees with the target: mass outside the support."""
    t = _target_logits(32, 2)
    d = t[:DEPTH] + np.random.default_rng(3).normal(size=(DEPTH, 32)) * 2.0
    return Round(_softmax(t), [build_row(d[i], top_k=4) for i in range(DEPTH)])


def temperature_round(t_draft: float = 0.6) -> Round:
    """The draft's own temperature != 1 (q built and sampled at that temperature)."""
    t = _target_logits(16, 4)
    d = t[:DEPTH] + np.random.default_rng(5).normal(size=(DEPTH, 16)) * 0.5
    return Round(_softmax(t), [build_row(d[i], temperature=t_draft) for i in range(DEPTH)])


def equal_round() -> Round:
    """q = p exactly (dyadic p): every draft accepted, the bonus at every round."""
    t = _target_logits(16, 6)
    rows = [build_row(t[i]) for i in range(DEPTH + 1)]
    return Round(np.stack([r.dense_counts() / MASS for r in rows]), rows[:DEPTH])


def processed_round() -> Round:
    """The target's p after processors (T = 0.7, top-p 0.9: exact zeros in p), a draft
    at its own temperature 0.8 on top-8 support: the p every path must verify against."""
    t = _target_logits(32, 7)
    d = t[:DEPTH] + np.random.default_rng(8).normal(size=(DEPTH, 32)) * 0.7
    p = processed_probs(torch.from_numpy(t), temperature=0.7, top_p=0.9).numpy()
    assert (p == 0).any(axis=1).all()  # top-p really cut every row
    return Round(p, [build_row(d[i], temperature=0.8, top_k=8) for i in range(DEPTH)],
                 p_unprocessed=_softmax(t))


REGIMES = {
    "negated": negated_round,
    "sparse": sparse_round,
    "temperature": temperature_round,
    "equal": equal_round,
    "processed": processed_round,
}


def test_simulation_uses_the_library_sampler_and_draws():
    rnd = negated_round()
    out_prop, *_ = _draws(4, DEPTH)
    for t in range(4):
        for i in range(DEPTH):
            u = proposal_u24(SEED, GEN, t, FIRST_POSITION + i)
            assert u == out_prop[t, i]
            assert _sample_many(rnd.q_sampling[i], np.array([u]))[0] == sample(rnd.q_sampling[i], u)


def test_negated_regime_rejects_heavily():
    rnd = negated_round()
    out = simulate(rnd, 20_000)
    reached_2 = (out[:, 1] >= 0).mean()
    assert reached_2 < 0.35  # > 65% of rounds end with a correction at position 1


@pytest.mark.parametrize("name", list(REGIMES))
def test_output_matches_target_per_position(name):
    rnd = REGIMES[name]()
    res, rejected = _check(rnd)
    assert not rejected, [str(r) for r in res]
    assert res[0].n == TRIALS and res[0].df >= 10  # position 1 tested on every trial
    if name == "equal":
        assert all(r.n == TRIALS for r in res)  # q = p: nothing is ever rejected


# ---------------------------------------------------------------------------
# planted bugs: the same check rejects each broken variant


@pytest.mark.parametrize("bug", ["a_acceptance_noise", "a_proposal_noise"])
def test_planted_shared_noise_rejected(bug):
    res, rejected = _check(negated_round(), bug=bug)
    assert rejected, [str(r) for r in res]


def _support_only_residual(p, q_counts, total):
    """Planted bug (b): residual max(p - q, 0) restricted to q's support."""
    return np.where(q_counts > 0, verify.np.maximum(p - q_counts * (total / MASS)[:, None], 0), 0)


def _softmax_residual(p, q_counts, total):
    """Planted variant (b'): residual 'normalised' with softmax (transformers #28508)."""
    return _softmax(np.maximum(p - q_counts * (total / MASS)[:, None], 0))


@pytest.mark.parametrize("broken", [_support_only_residual, _softmax_residual])
def test_planted_residual_bugs_rejected(monkeypatch, broken):
    monkeypatch.setattr(verify, "_residual_weights", broken)
    res, rejected = _check(sparse_round())
    assert rejected, [str(r) for r in res]


@pytest.mark.parametrize("bug", ["c_shifted_q", "d_bonus_from_p_depth"])
def test_planted_indexing_bugs_rejected(bug):
    rnd = temperature_round() if bug == "c_shifted_q" else equal_round()
    res, rejected = _check(rnd, bug=bug)
    assert rejected, [str(r) for r in res]


def test_planted_processors_on_one_path_only_rejected():
    res, rejected = _check(processed_round(), bug="g_processors_one_path")
    assert rejected, [str(r) for r in res]


def test_planted_selective_admission_rejected():
    res, rejected = _check(equal_round(), bug="e_selective_admission")
    assert rejected and res[0].rejected, [str(r) for r in res]


def test_planted_q_not_the_q_that_sampled_rejected():
    # (f) tokens sampled at draft temperature 1.0, q sent built at 0.7 from the same logits
    t = _target_logits(16, 4)
    d = t[:DEPTH] + np.random.default_rng(5).normal(size=(DEPTH, 16)) * 0.5
    sampled = [build_row(d[i], temperature=1.0) for i in range(DEPTH)]
    sent = [build_row(d[i], temperature=0.7) for i in range(DEPTH)]
    res, rejected = _check(Round(_softmax(t), sampled, sent))
    assert rejected, [str(r) for r in res]
    res, rejected = _check(Round(_softmax(t), sent))  # control: the q that sampled
    assert not rejected, [str(r) for r in res]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REGIMES))
def test_output_matches_target_long(name):
    rnd = REGIMES[name]()
    res, rejected = _check(rnd, trials=2_000_000)
    assert not rejected, [str(r) for r in res]


# ---------------------------------------------------------------------------
# Markov chain regime: p_i and q_i both conditioned on the previous token


class Chain:
    """Target and draft are first-order Markov: row i depends on x_{i-1} (x_0 = START)."""

    START = 3

    def __init__(self, vocab=8, depth=3, seed=11, t_draft=0.8):
        rng = np.random.default_rng(seed)
        t = rng.normal(size=(depth + 1, vocab, vocab)) * 1.5
        d = t[:depth] + rng.normal(size=(depth, vocab, vocab))
        self.p = _softmax(t)  # [D+1, ctx, V]
        self.q = [[build_row(d[i, c], temperature=t_draft) for c in range(vocab)]
                  for i in range(depth)]
        self.depth, self.vocab = depth, vocab

    def simulate(self, trials: int, stale_q: bool = False) -> np.ndarray:
        D, V = self.depth, self.vocab
        prop, acc, corr, bonus = _draws(trials, D)
        ctx = np.full((trials, D + 1), self.START, dtype=np.int64)
        drafts = np.empty((trials, D), dtype=np.int64)
        for i in range(D):  # the worker's chain: each row conditioned on the previous draft
            for c in range(V):
                m = ctx[:, i] == c
                drafts[m, i] = _sample_many(self.q[i][c], prop[m, i])
            ctx[:, i + 1] = drafts[:, i]
        q_dense = np.stack([[r.dense_counts() for r in rows] for rows in self.q])  # [D, ctx, V]
        q_ctx = np.full_like(ctx[:, :D], self.START) if stale_q else ctx[:, :D]
        p = self.p[np.arange(D + 1), ctx]  # [T, D+1, V]: per-trial target rows
        accepted, token, _ = decide(p, DenseQ(q_dense[np.arange(D), q_ctx]), drafts,
                                    acc, corr, bonus)
        return _outputs(drafts, accepted, token)

    def position_tests(self, out):
        """Per position, G summed over contexts (the previous output token)."""
        results = []
        for j in range(self.depth + 1):
            prev = np.full(out.shape[0], self.START) if j == 0 else out[:, j - 1]
            stat, df = 0.0, 0
            for c in range(self.vocab):
                tok = out[(prev == c) & (out[:, j] >= 0), j]
                r = g_test(np.bincount(tok, minlength=self.vocab), self.p[j, c])
                stat, df = stat + r.stat, df + r.df
            results.append(FitTest(stat, df, threshold(df), int((out[:, j] >= 0).sum())))
        return results


def test_markov_chain_output_matches_target_per_position_and_context():
    chain = Chain()
    res = chain.position_tests(chain.simulate(100_000))
    assert not any(r.rejected for r in res), [str(r) for r in res]
    assert res[-1].n > 5_000 and res[-1].df > 20  # the bonus position is well populated


def test_planted_stale_context_q_rejected():
    # (f) again, chain flavour: q sent conditioned on the round's start, not on x_{i-1}
    chain = Chain()
    res = chain.position_tests(chain.simulate(100_000, stale_q=True))
    assert any(r.rejected for r in res), [str(r) for r in res]
