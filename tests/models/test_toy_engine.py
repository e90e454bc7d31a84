"""The toy pair behind the engine seam gives exactly what the toy models give directly."""

from __future__ import annotations

import numpy as np
import pytest

from pp1q.core.errors import LocalProtocolError
from pp1q.models.ledger import Ledger
from pp1q.models.proposal import propose
from pp1q.models.toy import ToyDrafter, ToySpec, ToyTarget
from pp1q.models.toy_engine import ToyDrafterEngine, ToyTargetEngine
from pp1q.worker.proposer import ProposalSpec
from pp1q.worker.proposer import propose as toy_propose

SPEC = ToySpec(vocab=512, seed=3)


def test_seam_chain_equals_toy_chain():
    model = ToyDrafter(SPEC, distance=0.2)
    engine = ToyDrafterEngine(model)
    prefix = [5, 9, 17, 33]
    engine.open("r", prefix)
    for round_id in range(3):
        spec = ProposalSpec(seed=1, generation=0, round_id=round_id, first_position=len(prefix),
                            depth=4, temperature=0.8, top_k=32 if round_id else None)
        want = list(toy_propose(model, prefix, spec))
        got = list(propose(engine, "r", spec))
        assert [s.token for s in got] == [t for t, _ in want]
        assert all(s.row == row for s, (_, row) in zip(got, want, strict=True))
        accepted = round_id  # 0, 1, 2 accepted, then a correction token
        engine.commit("r", accepted, 7)
        prefix = prefix + [s.token for s in got[:accepted]] + [7]
        assert engine._requests.get("r").committed == prefix


def test_backbone_rows_do_not_depend_on_how_many_are_asked_for():
    """The seam's drafter asks for more backbone rows than a chain drafts (8 or more);
    the toy chain asks for its depth. Row i must be the same bits either way (a BLAS
    product's row i of 4 rows and of 8 differed in the last bits on an AMD EPYC)."""
    model = ToyDrafter(SPEC, distance=0.2)
    prefix = [5, 9, 17, 33]
    most = model.backbone(prefix, 16)
    for depth in range(1, 16):
        assert np.array_equal(model.backbone(prefix, depth), most[:depth]), depth


def _term_by_term(h: np.ndarray, out: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """project_rows' stated order, written out: a float32 sum over r, term by term."""
    rows = np.ascontiguousarray(h.T)
    total = rows[:, :1] * out[0]
    for k in range(1, out.shape[0]):
        total += rows[:, k:k + 1] * out[k]
    return total + bias


@pytest.mark.parametrize("vocab", [SPEC.vocab, 5])
def test_target_rows_do_not_depend_on_how_many_are_scored(vocab):
    """A round scores D + 1 rows, a target-only step one: row i must be the p the
    target-only step reads for the same prefix, bit for bit, and a vocabulary shard's ids
    the whole row's, one id wide included (with an sgemm every row of 17 differed from
    the one-row step in a float32 rounding, on an Intel Xeon; with einsum alone a one-id
    shard differed from the whole row)."""
    from pp1q.models.toy import project_rows
    from pp1q.verifier.ranks.shard_target import ToyShard

    model = ToyTarget(ToySpec(vocab=vocab, seed=SPEC.seed))
    prefix, drafts = [4, 1, 3, 2], [(40 + i) % vocab for i in range(16)]
    most = model.logits(prefix, drafts)
    for i in range(len(drafts) + 1):
        assert np.array_equal(model.logits(prefix + drafts[:i], [])[0], most[i]), i
        assert np.array_equal(model.logits(prefix, drafts[:i]), most[:i + 1]), i
    cuts = [(0, 1), (vocab - 1, vocab), (1, 3), (0, vocab)] + [(100, 300)] * (vocab > 300)
    for lo, hi in cuts:
        shard = ToyShard(model, lo, hi)
        for i in (0, 3, len(drafts)):
            assert np.array_equal(shard.logits(0, prefix, drafts[:i]).numpy(),
                                  most[:i + 1, lo:hi]), (lo, hi, i)
    h = np.random.default_rng(vocab).standard_normal((16, 6)).astype(np.float32)
    w = model._w  # noqa: SLF001 - the order itself, on the toy's own weights
    for lo, hi in cuts:
        out = np.ascontiguousarray(w.e_out_t[:, lo:hi])
        assert np.array_equal(project_rows(h, out, w.bias[lo:hi]),
                              _term_by_term(h, out, w.bias[lo:hi])), (lo, hi)


def test_toy_target_engine_equals_toy_target():
    model = ToyTarget(SPEC)
    engine = ToyTargetEngine(model)
    engine.open(1, [4, 5, 6])
    out = engine.score([(1, [7, 8])])[0].numpy()
    assert np.array_equal(out, model.logits([4, 5, 6], [7, 8]))
    engine.commit(1, 1, 9)
    assert np.array_equal(engine.score([(1, [])])[0].numpy(), model.logits([4, 5, 6, 7, 9], []))


def test_ledger_rules():
    led = Ledger.start([1, 2, 3])
    led.cached = 2
    led.spec = [4, 5, 6]
    assert led.feed_start(4) == 2
    led.cached = 6
    assert led.feed_start(4) == 2 and led.feed_start(1) == 5
    assert led.commit(1, 9) == 4 and led.tokens == [1, 2, 3, 4, 9] and led.cached == 4
    led.spec = [10]
    led.cached = 6
    assert led.reset() == 5 and led.feed_start(1) == 4
    with pytest.raises(LocalProtocolError):
        led.commit(1, 0)  # nothing speculative to accept
    with pytest.raises(LocalProtocolError):
        Ledger.start([])
