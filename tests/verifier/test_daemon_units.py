"""In-process pieces of the daemons: settings, prefixes, the session table's held
contexts, worker state, greedy decisions, failure classification, the accepted-length
expectation."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from pp1q.cli import verifier as verifier_cmd
from pp1q.cli import worker as worker_cmd
from pp1q.core.errors import ConfigError, Reason
from pp1q.core.outcomes import FallbackCause
from pp1q.core.prefix import Prefix, digest_of
from pp1q.models.toy import toy_pair
from pp1q.runtime.config import resolve
from pp1q.runtime.settings import parse_hostport
from pp1q.tools.theory import expected_accepted
from pp1q.verifier import rounds
from pp1q.verifier.outcome import classify
from pp1q.wire.events import ProposalFailed
from pp1q.wire.sessions import SessionTable


def _args(parser_fn, argv):
    p = argparse.ArgumentParser()
    parser_fn(p)
    return p.parse_args(argv)


def test_settings_precedence_and_refusals(tmp_path):
    cfg = tmp_path / "pp1q.toml"
    cfg.write_text('vocab = 64\nmodel_seed = 3\n[verifier]\nhttp = "127.0.0.1:9000"\n'
                   'watchdog_ms = 700\n[worker]\nlisten = "127.0.0.1:9001"\n')
    args = _args(verifier_cmd.add_arguments, ["--config", str(cfg), "--watchdog-ms", "900"])
    s = resolve(args, "verifier")
    assert (s.vocab, s.model_seed, s.http, s.watchdog_ms) == (
        64, 3, "127.0.0.1:9000", 900)  # option > [verifier] > top level > default
    assert s.slots == 4 and s.depth == 5
    w = resolve(_args(worker_cmd.add_arguments, ["--config", str(cfg)]), "worker")
    assert (w.listen, w.vocab) == ("127.0.0.1:9001", 64)
    for text, needle in [("[verifier]\nbogus = 1\n", "bogus .*unknown key"),
                         ("vocab = 'many'\n", "vocab = 'many' .*must be an integer"),
                         ("vocab = \n", "config")]:
        cfg.write_text(text)
        with pytest.raises(ConfigError, match=needle):
            resolve(_args(verifier_cmd.add_arguments, ["--config", str(cfg)]), "verifier")
    assert parse_hostport("[::1]:80") == ("::1", 80)
    with pytest.raises(ConfigError):
        parse_hostport("localhost")


def test_prefix_digest_is_incremental_and_order_sensitive():
    p = Prefix([1, 2])
    p.extend([3])
    assert p.digest == digest_of([1, 2, 3]) != digest_of([1, 3, 2])
    assert p.last_position == 2 and len(p.copy()) == 3


def test_session_table_counts_held_contexts():
    """The slots-in-use gauge: contexts held by live sessions (the table's bounds are
    tests/wire/test_wire_hostile.py's)."""
    from wire_helpers import SESSION, pair

    from pp1q.wire import Reset

    st = SessionTable()
    v, w = pair()  # every slot holds a context
    st.admit(w, "conn", 0.0)
    st.open(w, w.session)
    assert st.slots_held() == len(w.slots)
    w.receive_data(v.send(Reset(session=SESSION, slot=0, generation=0,
                                reason=Reason.STEP_TIMEOUT)), 0.0)
    assert st.slots_held() == len(w.slots)  # a discarded proposal: the prefix stays
    w.receive_data(v.send(Reset(session=SESSION, slot=1, generation=0,
                                reason=Reason.CANCELLED)), 0.0)
    assert st.slots_held() == len(w.slots) - 1  # the request ended
    st.release(w)
    assert st.slots_held() == 0


def test_greedy_round_accepts_the_matching_prefix():
    rows = np.array([[0, 5, 1], [9, 0, 0], [0, 0, 3], [1, 2, 0]], dtype=float)
    assert rounds.greedy(rows, [1, 0, 1]) == rounds.Outcome(2, 2)  # third draft != argmax 2
    assert rounds.greedy(rows, [1, 0, 2]) == rounds.Outcome(3, 1)  # all accepted: bonus


def test_greedy_decides_alike_on_host_rows_and_tensors():
    """A real target's greedy rows stay a tensor on its device (EngineDecider): the argmax
    there is numpy's, ties to the lowest id and a NaN taken as the largest."""
    import torch

    rows = np.array([[0, 5, 5], [9, 0, 9], [np.nan, 0, 3], [1, np.nan, np.nan]])
    for drafts in ([1, 0, 0], [1, 0, 2], [2, 0, 0], [1, 2, 0]):
        assert rounds.greedy(torch.from_numpy(rows), drafts) == rounds.greedy(rows, drafts)
    for row in rows:
        assert rounds.target_only(torch.from_numpy(row), 0, 1, 1, 4, True) \
            == rounds.target_only(row, 0, 1, 1, 4, True) == rounds.Outcome(0, int(np.argmax(row)))


@pytest.mark.parametrize("reason, detail, by_peer, cause", [
    (Reason.STEP_TIMEOUT, "deadline", False, FallbackCause.WATCHDOG_TIMEOUT),
    (Reason.CONNECTION_LOST, "", False, FallbackCause.CONNECTION_LOST),
    (Reason.WORKER_ABORTED, "", False, FallbackCause.WORKER_REFUSED),
    (Reason.STALE_GENERATION, "generation 3", True, FallbackCause.WORKER_REFUSED),
    (Reason.STALE_GENERATION, "peer: looks refused", False, FallbackCause.INVALID_REPLY),
    (Reason.CHECKSUM_MISMATCH, "REPLY payload", False, FallbackCause.INVALID_REPLY),
    (Reason.MISSING_Q, "sampled step answered without q", False, FallbackCause.INVALID_REPLY),
])
def test_failures_map_to_fallback_causes(reason, detail, by_peer, cause):
    """The cause comes from the event's flag, never from its free-text detail."""
    assert classify(ProposalFailed(0, 1, 1, reason, detail, by_peer)) is cause


def test_expected_accepted_orders_the_presets():
    prompts = [[1, 2], [3, 4], [5, 6]]
    matched = expected_accepted(*toy_pair(16, 0, "matched"), prompts, rounds_per_prompt=3)[0]
    far = expected_accepted(*toy_pair(16, 0, "far"), prompts, rounds_per_prompt=3)[0]
    adversarial = expected_accepted(*toy_pair(16, 0, "adversarial"), prompts,
                                    rounds_per_prompt=3)[0]
    assert 5 >= matched > far > adversarial >= 0


def test_a_rank_without_a_gpu_of_its_own_is_refused_by_name(monkeypatch):
    """``device = "cuda"`` gives local rank r cuda:r; a machine with fewer GPUs than ranks
    is a ConfigError naming the setting, before any model is loaded on a missing GPU."""
    import torch

    from pp1q.verifier.daemon import rank_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [rank_device("cuda", r) for r in (0, 1)] == ["cuda:0", "cuda:1"]
    assert rank_device("cuda:1", 5) == "cuda:1" and rank_device("cpu", 5) == "cpu"
    with pytest.raises(ConfigError, match="local rank 2 has no GPU") as e:
        rank_device("cuda", 2)
    assert e.value.key == "device"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="has 0"):
        rank_device("cuda", 0)


def test_a_daemon_makes_its_own_gpu_the_current_one_before_loading(monkeypatch):
    """What uses the current CUDA device (pinned staging, a bare synchronize) must land on
    the daemon's or rank's own GPU, not cuda:0: the model loader makes a named CUDA device
    current before it loads, and leaves the CPU (and a plain ``cuda``) alone."""
    import types

    import torch

    from pp1q.models import hf, serving

    events = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: events.append(("current", str(d))))
    monkeypatch.setattr(hf, "load_checkpoint",
                        lambda path, device, **_: events.append(("load", device)))
    settings = types.SimpleNamespace(device="cpu", dtype="float32", gguf_cache=None)
    serving._load("model", settings, "cuda:1")  # a rank's device (rank_device)
    serving._load("model", settings)
    serving._load("model", types.SimpleNamespace(**{**vars(settings), "device": "cuda"}))
    assert events == [("current", "cuda:1"), ("load", "cuda:1"), ("load", "cpu"),
                      ("load", "cuda")]
