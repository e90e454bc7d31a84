"""The daemon-level distribution experiment shared by the distribution, ranks, chaos
matrix and chaos CLI tests: vocabulary 16, prompt [3, 7], three new tokens, exact
per-position marginals under the toy target, and the goodness-of-fit judge (stats.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from daemon_harness import Pair, replay
from scipy import stats
from stats import ALPHA, g_test

from pp1q.models.processors import Processors
from pp1q.models.toy import ToySpec, ToyTarget

VOCAB = 16
PROMPT = [3, 7]
NEW_TOKENS = 3
N = 1000  # requests per arm (bounded default run)
N_SLOW = 6000  # --runslow
# the processed arm: target T = 0.7 and top-p 0.9 on p, a sparse top-4 q drafted at T = 0.6
PROCESSED = {"temperature": 0.7, "top_p": 0.9, "top_k": 4, "draft_temperature": 0.6}


def exact_marginals(processors: Processors | None = None) -> np.ndarray:
    """[NEW_TOKENS, VOCAB]: marginal of each generated position under the target (after
    ``processors``: what target-only sampling with them gives)."""
    target = ToyTarget(ToySpec(vocab=VOCAB, seed=0))

    def probs(prefix):
        if processors is None:
            return target.probs(prefix, [])[0]
        return processors.probs(torch.from_numpy(target.logits(prefix, [])[0])).numpy()

    out = np.zeros((NEW_TOKENS, VOCAB))
    joint = {(): 1.0}
    for pos in range(NEW_TOKENS):
        nxt = {}
        for prefix, w in joint.items():
            p = probs(PROMPT + list(prefix))
            out[pos] += w * p
            if pos + 1 < NEW_TOKENS:
                for x in range(VOCAB):
                    nxt[prefix + (x,)] = w * p[x]
        joint = nxt
    return out


def counts(answers: list[dict]) -> np.ndarray:
    c = np.zeros((NEW_TOKENS, VOCAB), dtype=np.int64)
    for a in answers:
        assert len(a["token_ids"]) == NEW_TOKENS
        for pos, t in enumerate(a["token_ids"]):
            c[pos, t] += 1
    return c


def run_arm(pair: Pair, n: int, speculative: bool, first_seed: int,
            options: dict | None = None) -> list[dict]:
    """``options``: request fields (default: dense q, T = 1 everywhere)."""
    extra = {"top_k": None} if options is None else options
    bodies = [{"prompt": PROMPT, "max_tokens": NEW_TOKENS, "seed": first_seed + i,
               "speculative": speculative, **extra} for i in range(n)]
    return pair.generate_many(bodies)


def worst_position(c: np.ndarray, exact: np.ndarray):
    results = [g_test(c[pos], exact[pos]) for pos in range(NEW_TOKENS)]
    return max(results, key=lambda r: r.stat / r.threshold), results


def check_arms(spec: list[dict], base: list[dict], explain=None) -> None:
    """The speculative arm corrected drafts and never fell back; both arms' tokens fit the
    exact marginals, position by position (``explain(label, counts, exact, results)``:
    the message of a rejection; default, the results); and the speculative and
    target-only samples fit each other (Pearson contingency at ALPHA)."""
    drafted = sum(a["stats"]["drafted"] for a in spec)
    accepted = sum(a["stats"]["accepted"] for a in spec)
    assert drafted > 0 and 0 < accepted < drafted  # corrections really happened
    assert all(not any(a["stats"]["fallbacks"].values()) for a in spec)
    exact = exact_marginals()
    c_spec, c_base = counts(spec), counts(base)
    for label, c in (("speculative", c_spec), ("target-only", c_base)):
        worst, results = worst_position(c, exact)
        assert not worst.rejected, (explain(label, c, exact, results) if explain else
                                    f"{label} vs exact: {[str(r) for r in results]}")
    for pos in range(NEW_TOKENS):  # two-sample: speculative vs target-only
        table = np.stack([c_spec[pos], c_base[pos]])
        table = table[:, table.sum(axis=0) > 0]
        p_value = stats.chi2_contingency(table)[1]
        assert p_value > ALPHA, f"position {pos + 1}: speculative != target-only, p={p_value}"


REVERIFY_TIMEOUT_S = 120.0  # a few thousand rounds of vocabulary 16: seconds of work


def explain_rejection(label: str, c: np.ndarray, exact: np.ndarray, results,
                      capture: Path, secret: Path) -> str:
    """What a failed distribution check leaves for whoever reads the CI log: each
    rejected position's observed and expected counts per token, and every captured
    round decided again (``pp1q replay --reverify``) from the verifier's capture with its
    draw secret. Divergences mean the daemon decided a round otherwise than the same
    rules decide it now (process state, a race); none means the rounds were decided as
    the rules say, and the rules, the target's p or the sample itself are in question.
    The capture and the secret stay in the test's tmp_path."""
    lines = [f"{label} vs exact: {[str(r) for r in results]}"]
    for pos, r in enumerate(results):
        if r.rejected:
            n = int(c[pos].sum())
            lines.append(f"position {pos + 1}, observed / expected per token: " + ", ".join(
                f"{t}: {int(c[pos, t])}/{exact[pos, t] * n:.1f}" for t in range(c.shape[1])))
    proc = replay(capture, "--reverify", "--json", "--draw-secret-file", str(secret),
                  timeout_s=REVERIFY_TIMEOUT_S)
    try:
        report = json.loads(proc.stdout)
        lines.append(f"reverify of {capture}: ok={report['ok']}, "
                     f"{report['rechecked']} commits re-decided, "
                     f"{len(report['divergences'])} divergences "
                     f"{report['divergences'][:3]}, {report['not_rechecked']} not re-checked")
    except (json.JSONDecodeError, KeyError):
        lines.append(f"reverify of {capture} failed (rc {proc.returncode}): "
                     f"{(proc.stdout + proc.stderr)[-500:]}")
    return "\n".join(lines)
