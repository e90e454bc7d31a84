"""The numba decision path (pp1q_kernels.numba_rows, numba_step) decides exactly as the
torch lazy step (pp1q_kernels.lazy_step), which tests/kernels/test_kernels_lazy.py holds
to the batched step and that to the rational oracle: identical (accepted, token,
underflow) over random rounds (every regime, sparse and dense q, float32 and float64 p,
the target's processors, vocabularies across block edges, depths 1-5), target-only picks,
and draws placed exactly on the ratio test's and the pick's boundaries (dyadic rows, where
the integer rule is the oracle's exactly: both are checked against it there). The same
refusals. Planted bugs (copies of the kernel or driver file with one change, loaded through
the seam the service uses: the kernels module handed to ``decide_rows``) are rejected."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from kernels_cases import keys, received_dense
from test_kernels_verify import REGIMES, make_batch

from pp1q.core import backend_choice
from pp1q.core import reference as ref
from pp1q.core.errors import ConfigError, DistributionError, LocalProtocolError, Reason
from pp1q.core.q import MASS, DyadicRow
from pp1q.core.verify import RoundKeys
from pp1q.core.verify import round_draws as verify_draws
from pp1q.models.processors import processed_probs
from pp1q.verifier.kernel_rounds import warm_up_decisions
from pp1q_kernels import numba_rows
from pp1q_kernels import verify_step as vs
from pp1q_kernels.lazy_step import decide_rows as torch_decide
from pp1q_kernels.lookup import SparseCounts, count_at, from_rows
from pp1q_kernels.residual import target_sample

pytestmark = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                reason="numba not installed (the fast extra)")
PROCESSORS = [(0.7, None, None), (1.0, 5, None), (1.3, None, 0.8), (0.5, 9, 0.9)]


def kernels():
    return numba_rows.CHOICE.choose("numba")[2]


def rows_of(q: SparseCounts):
    def at(i):
        return q.index(torch.arange(i.shape[0]), i)
    return at


def both(k, p, q, rows, draft, u, D, driver=numba_rows, dense=False):
    """(torch's, numba's) (accepted, token, underflow) lists for the same round; ``dense``:
    numba reads the q rows as received dense rows (``received_dense``)."""
    want = torch_decide(list(p), count_at(q, draft), rows_of(q), draft, *u)
    rows = [received_dense(r) for r in rows] if dense else rows
    chains = [rows[b * D:(b + 1) * D] for b in range(p.shape[0])]
    got = driver.decide_rows(k, [x.numpy() for x in p], count_at(q, draft).numpy(),
                                 chains, draft.numpy(), *(x.numpy() for x in u))
    return (want.accepted.tolist(), want.token.tolist(), want.underflow.tolist()), got


def random_rounds(seed: int, n: int):
    """(p, q, rows, draft, u, D) over regimes, dtypes, processors, vocab sizes, depths."""
    g = np.random.default_rng(seed)
    for m in range(n):
        V = int(g.choice([3, 37, 255, 256, 257, 600]))
        D = 1 + m % 5
        p, q, rows, draft = make_batch(g, REGIMES[m % len(REGIMES)], 3, D, V)
        if m % 3 == 1:  # the target's processors: exact zeros, other shapes
            t, k, tp = PROCESSORS[m % len(PROCESSORS)]
            p = processed_probs(torch.tensor(g.normal(0, 2, p.shape)), t, k, tp)
            x = p[:, :D].gather(-1, draft[..., None])
            p[:, :D].scatter_(-1, draft[..., None], x.clamp(min=1e-3))  # drafts keep mass
        elif m % 3 == 2:
            p = p.double()
        yield p, q, rows, draft, vs.step_draws(vs.StepKeys.from_keys(keys(g, 3)), D), D


def any_difference(k, driver=numba_rows, seed=60, n=150, dense=False) -> bool:
    """Whether some round is decided differently by the numba path and the torch path."""
    return any(a != b for a, b in (both(k, *r, driver=driver, dense=dense)
                                   for r in random_rounds(seed, n)))


@pytest.mark.experiment
@pytest.mark.parametrize("dense", [False, True], ids=["rows", "dense-in-place"])
def test_numba_equals_torch_on_random_rounds(dense):
    k = kernels()
    kinds = set()
    for p, q, rows, draft, u, D in random_rounds(60, 150):
        want, got = both(k, p, q, rows, draft, u, D, dense=dense)
        assert got == want
        kinds |= {(a == D, a > 0) for a in want[0]}
    assert kinds == {(True, True), (False, True), (False, False)}  # bonus, later, first


@pytest.mark.slow
def test_numba_equals_torch_on_many_rounds():
    k = kernels()
    assert not any_difference(k, seed=66, n=3000)
    assert not any_difference(k, seed=66, n=3000, dense=True)
    assert not boundary_difference(k, seed=67, n=5000)
    assert not boundary_difference(k, seed=67, n=5000, dense=True)


def dyadic_round(g, D: int, V: int):
    """p rows of multiples of 2^-10 summing to 1 and q rows of power-of-two counts: every
    ratio p(x) / q(x) and every pick boundary is a dyadic rational the draws can hit."""
    p = np.zeros((D + 1, V))
    for i in range(D + 1):
        cuts = np.sort(g.choice(np.arange(1, 1024), V - 1)) if V > 1 else np.array([], int)
        p[i] = np.diff(np.concatenate([[0], cuts, [1024]])) / 1024.0
    q_rows = []
    for _ in range(D):
        ids = np.sort(g.choice(V, size=min(V, 3), replace=False)).astype(np.int32)
        counts = np.array([MASS // 2, MASS // 4, MASS // 4][: ids.size], np.int64)
        counts[0] += MASS - counts.sum()
        q_rows.append(DyadicRow(V, ids, counts))
    return p, q_rows


def boundary_draws(g, p, q_rows, draft):
    """(u_acc, u_corr, u_bonus): acceptance draws 0 before a chosen rejected position and
    exactly on its ratio boundary there (equality rejects); correction and bonus draws on
    the residual's cumulative boundaries (T == C_j picks the next id) or one below."""
    D = len(q_rows)
    S = 1 << 61  # exact: every row sums to 1 in multiples of 2^-10
    fix = [[int(x * 2**61) for x in row] for row in p]
    u_acc = np.zeros(D, np.int64)
    stop = int(g.integers(0, D + 1))
    for i in range(D):
        c = q_rows[i].count_of(int(draft[i]))
        num, den = fix[i][draft[i]] << 77, S * c
        if i == stop:
            u_acc[i] = min(-(-num // den), (1 << 53) - 1)  # the boundary: rejected
        elif num < den * (1 << 53):
            u_acc[i] = max(-(-num // den) - 1 - int(g.integers(0, 2)), 0)

    def on_boundary(weights):
        W = sum(weights)
        if W == 0:  # no residual (q == p on the row): that row is never rejected
            return int(g.integers(0, 1 << 53))
        cum = np.cumsum(weights)
        j = int(g.integers(0, len(weights)))
        u = -(-int(cum[j]) * (1 << 53) // W)  # smallest u with T >= C_j
        return max(u - int(g.integers(0, 2)), 0) if u < 1 << 53 else (1 << 53) - 1

    u_corr = np.zeros(D, np.int64)
    for i in range(D):
        cnt = q_rows[i].dense_counts()
        u_corr[i] = on_boundary([max(P - ((int(c) * S) >> 24), 0) for P, c in
                                 zip(fix[i], cnt, strict=True)])
    return u_acc, u_corr, on_boundary(fix[D])


def boundary_rounds(seed: int, n: int):
    g = np.random.default_rng(seed)
    for m in range(n):
        D, V = 1 + m % 4, int(g.choice([2, 5, 40]))
        p, q_rows = dyadic_round(g, D, V)
        draft = np.array([int(r.ids[g.integers(0, r.ids.size)]) for r in q_rows])
        yield p, q_rows, draft, boundary_draws(g, p, q_rows, draft)


def boundary_difference(k, seed=61, n=300, dense=False) -> bool:
    """Whether some boundary round is decided differently by numba and torch (torch's
    decisions are checked against the oracle's on the way); ``dense``: numba reads the q
    rows in place, as received dense rows."""
    for p, q_rows, draft, (ua, uc, ub) in boundary_rounds(seed, n):
        D = len(q_rows)
        q = from_rows(q_rows).reshape(1, D)
        dt = torch.tensor(draft[None])
        want = torch_decide([torch.tensor(p)], count_at(q, dt), rows_of(q), dt,
                            torch.tensor(ua[None]), torch.tensor(uc[None]),
                            torch.tensor([ub]))
        chain = [received_dense(r) for r in q_rows] if dense else q_rows
        got = numba_rows.decide_rows(k, [p], count_at(q, dt).numpy(), [chain], draft[None],
                                     ua[None], uc[None], np.array([ub]))
        oracle = ref.oracle_round(list(p), q_rows, list(draft),
                                  ref.RoundDraws(tuple(ua.tolist()), tuple(uc.tolist()), ub))
        assert (want.accepted.tolist(), want.token.tolist()) == ([oracle.accepted],
                                                                 [oracle.token])
        if got != (want.accepted.tolist(), want.token.tolist(), want.underflow.tolist()):
            return True
    return False


@pytest.mark.parametrize("dense", [False, True], ids=["rows", "dense-in-place"])
def test_numba_equals_torch_and_oracle_on_boundary_draws(dense):
    assert not boundary_difference(kernels(), dense=dense)


def test_target_only_picks_equal():
    k = kernels()
    g = np.random.default_rng(62)
    for m in range(200):
        V = int(g.choice([1, 3, 256, 257, 700]))
        p = processed_probs(torch.tensor(g.normal(0, 2, V)), *PROCESSORS[m % 4])
        p = p.float() if m % 2 else p
        u = int(g.integers(0, 1 << 53))
        assert numba_rows.target_pick(k, p.numpy(), u) == int(target_sample(p[None],
                                                                             torch.tensor([u]))[0])


def refused(fn):
    try:
        fn()
    except (DistributionError, LocalProtocolError) as e:
        return e.reason
    return None


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "negative", "above_one", "sum_two",
                                 "zero", "int"])
def test_same_refusals(bad):
    k = kernels()
    g = np.random.default_rng(63)
    p, q, rows, draft = make_batch(g, "adversarial", 1, 3, 300)
    p = p.double().numpy()
    x = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "negative": -1e-9,
         "above_one": 1.5}.get(bad)
    if x is not None:
        p[0, 0, 7] = x
    elif bad == "sum_two":
        p[0, 0] = 0.9
    elif bad == "zero":
        p[0, 0] = 1e-30  # below 2^-61 everywhere: no mass in fixed point
    else:
        p = (p * 100).astype(np.int64)
    u = vs.step_draws(vs.StepKeys.from_keys(keys(g, 1)), 3)
    want = refused(lambda: torch_decide(list(torch.from_numpy(p)), count_at(q, draft),
                                        rows_of(q), draft, *u))
    got = refused(lambda: numba_rows.decide_rows(k, list(p), count_at(q, draft).numpy(),
                                                 [rows], draft.numpy(),
                                                 *(t.numpy() for t in u)))
    assert want is not None and got == want
    if p.dtype == np.float64:
        got = refused(lambda: numba_rows.target_pick(k, p[0, 0], 5))
        assert got == refused(lambda: target_sample(torch.from_numpy(p[0, 0])[None],
                                                    torch.tensor([5])))


def test_q_rows_of_another_vocabulary_are_refused_before_any_read():
    """The kernels run without bounds checks: a chosen q row with ids past the target's
    vocabulary is refused first (as the torch step refuses it)."""
    k = kernels()
    g = np.random.default_rng(68)
    p, q, rows, draft = make_batch(g, "adversarial", 1, 2, 40)
    u = vs.step_draws(vs.StepKeys.from_keys(keys(g, 1)), 2)
    u[0][:] = (1 << 53) - 1  # row 0 is rejected: its q row is the one read
    wide = DyadicRow(1000, np.array([int(draft[0, 0]), 999], np.int32),
                     np.array([MASS // 2, MASS // 2], np.int64))
    chain = [wide, DyadicRow(1000, rows[1].ids, rows[1].counts)]
    got = refused(lambda: numba_rows.decide_rows(k, list(p.numpy()), count_at(q, draft).numpy(),
                                                 [chain], draft.numpy(),
                                                 *(t.numpy() for t in u)))
    wq = from_rows(chain).reshape(1, 2)
    want = refused(lambda: torch_decide(list(p), count_at(q, draft), rows_of(wq), draft, *u))
    assert got == want == Reason.UNEXPECTED_SIZE


def test_unreached_rows_are_not_read():
    """As the lazy step (and the oracle): a bad row after the first rejection is no
    refusal; both decide the round."""
    k = kernels()
    g = np.random.default_rng(64)
    p, q, rows, draft = make_batch(g, "adversarial", 1, 3, 50)
    u = vs.step_draws(vs.StepKeys.from_keys(keys(g, 1)), 3)
    u[0][:] = (1 << 53) - 1  # every ratio test below 1 rejects: row 0 decides
    p[0, 2, 0] = float("nan")
    want, got = both(k, p, q, rows, draft, u, 3)
    assert want[0] == [0] and got == want


def test_choice_and_fallback(monkeypatch):
    assert numba_rows.CHOICE.choose("torch")[0] == "torch"
    assert numba_rows.CHOICE.choose("auto")[0] == "numba"
    with pytest.raises(ConfigError, match="PP1Q_DECIDE"):
        numba_rows.CHOICE.choose("fastest")
    monkeypatch.setenv(numba_rows.ENV, "fastest")  # the daemon refuses to start on it
    monkeypatch.setattr(numba_rows.CHOICE, "_chosen", None)
    with pytest.raises(ConfigError, match="PP1Q_DECIDE='fastest'"):
        warm_up_decisions()
    monkeypatch.setattr(backend_choice.importlib.util, "find_spec", lambda name: None)
    assert numba_rows.CHOICE.choose("auto")[:2] == ("torch", "numba not installed")
    with pytest.raises(ConfigError, match="not installed"):
        numba_rows.CHOICE.choose("numba")


# ---------------------------------------------------------------------------
# planted bugs: a copy of a production file with one change, through the same seam


@pytest.fixture
def planted_dir(request, tmp_path) -> Path:
    """Where planted copies are written: a folder in pytest's cache that outlives the run,
    so numba's own cache beside each copy (same path, same text, same mtime) serves the
    next run its compiled kernels (5-8 s a planted module to compile); tmp_path when the
    cache plugin is off (``-p no:cacheprovider``)."""
    cache = getattr(request.config, "cache", None)
    return tmp_path if cache is None else cache.mkdir("planted-kernels")


def planted(folder: Path, module, old: str, new: str):
    """``module`` loaded from a copy of its file with ``old`` replaced by ``new``: the copy
    is named by its text's digest and written once (atomically: xdist workers share it)."""
    src = Path(module.__file__).read_text()
    assert src.count(old) == 1, old
    text = src.replace(old, new)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = folder / f"planted_{module.__name__.rpartition('.')[2]}_{digest}.py"
    if not path.exists():
        part = path.with_suffix(f".{os.getpid()}.part")
        part.write_text(text)
        os.replace(part, path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod  # numba's cache finds a cached kernel's module by name
    spec.loader.exec_module(mod)
    return mod


def test_planted_ratio_test_off_by_one_is_rejected(planted_dir):
    """Equality accepts (``<=``): only draws exactly on the boundary can tell."""
    k = planted(planted_dir, kernels(), "(e_hi == r_hi) and (e_lo < r_lo)",
                "(e_hi == r_hi) and (e_lo <= r_lo)")
    assert boundary_difference(k)


def test_planted_pick_off_by_one_is_rejected(planted_dir):
    k = planted(planted_dir, kernels(), "e += 1\n        cum += r\n        if cum > t:",
                "e += 1\n        cum += r\n        if cum >= t:")
    assert boundary_difference(k)


def test_planted_dense_pick_off_by_one_is_rejected(planted_dir):
    k = planted(planted_dir, kernels(), "s_total))\n        cum += r\n        if cum > t:",
                "s_total))\n        cum += r\n        if cum >= t:")
    assert not boundary_difference(k)  # rows read by their ids: the dense pick unused
    assert boundary_difference(k, dense=True)


def test_planted_dense_overlap_missing_an_entry_is_rejected(planted_dir):
    k = planted(planted_dir, kernels(), "_dense_overlap(p[lo:hi], q[lo:hi], s_total)",
                "_dense_overlap(p[lo:hi - 1], q[lo:hi - 1], s_total)")
    assert any_difference(k, dense=True)


def test_planted_block_sum_missing_an_entry_is_rejected(planted_dir):
    k = planted(planted_dir, kernels(), "_block(p[k * BLOCK : min(v, (k + 1) * BLOCK)])",
                "_block(p[k * BLOCK : min(v, (k + 1) * BLOCK - 1)])")
    assert any_difference(k)


def test_planted_residual_at_the_wrong_position_is_rejected(planted_dir):
    """The driver takes the q row before the first rejection's for the residual."""
    driver = planted(planted_dir, numba_rows, "q_rows[b][a], scratch.totals[a]",
                     "q_rows[b][max(a - 1, 0)], scratch.totals[a]")
    assert any_difference(kernels(), driver)


# ---------------------------------------------------------------------------
# a round's draws


def test_round_draws_equal_pp1q_verify():
    g = np.random.default_rng(65)
    top = (1 << 32) - 1
    edge = [RoundKeys(0, 0, 0, 0), RoundKeys((1 << 64) - 1, (1 << 24) - 1, top, top - 5),
            RoundKeys(1 << 63, 1, 1, 1), RoundKeys((1 << 63) - 1, 7, 9, 11)]
    for n in range(60):
        depth = 1 + n % 5
        ks = keys(g, 1 + n % 4) + (edge if n % 10 == 0 else [])
        want = verify_draws(ks, depth)
        got = numba_rows.round_draws(ks, depth)
        assert all(np.array_equal(a, b) and b.dtype == np.int64
                   for a, b in zip(want, got, strict=True))


@pytest.mark.parametrize("field,value", [("seed", -1), ("seed", 1 << 64), ("seed", True),
                                         ("seed", 1.0), ("generation", 1 << 24),
                                         ("round_id", 1 << 32), ("first_position", -1),
                                         ("first_position", (1 << 32) - 3)])
def test_round_draws_refuse_as_pp1q_verify(field, value):
    k = dict(seed=5, generation=1, round_id=2, first_position=3)
    ks = [RoundKeys(**{**k, field: value})]
    assert refused(lambda: numba_rows.round_draws(ks, 3)) is Reason.RNG_KEY_OUT_OF_RANGE
    assert refused(lambda: verify_draws(ks, 3)) is Reason.RNG_KEY_OUT_OF_RANGE
