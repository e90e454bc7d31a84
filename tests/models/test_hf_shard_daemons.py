"""``pp1q verifier --ranks 2 --shard-vocab --model PATH`` on the embedded SmolLM2-135M,
over HTTP: each rank loads the checkpoint and keeps its rows of the LM head; sampled
speculation at a temperature, target-only and greedy requests serve the same tokens as
the single-process verifier would only if every decision were made from the same p,
so the test compares the group with itself across seeds (reproducible) and checks what
the issue asks of the daemon: it serves, both ranks decide, top-p and top-k are applied
across the shards, a top-k above the sharded limit is refused (422, counted) and the
group's answer is a valid decode of the tokenizer."""

from __future__ import annotations

import pytest
from daemon_harness import Pair, value
from rank_harness import rank_metrics

from pp1q.tools.client import ApiError

pytestmark = [pytest.mark.model, pytest.mark.daemons]

PROMPT = "Once upon a time, in a small village by the sea,"
STARTUP_S = 300  # both ranks load the model before rank 0 prints its ports (2 busy cores)


@pytest.fixture(scope="module")
def pair(smol, tmp_path_factory):  # smol: skips when the model or transformers is absent
    from pp1q.models.hf import export_folder

    folder = export_folder(smol, tmp_path_factory.mktemp("smollm2"))  # loads in ~1 s
    real = ["--model", str(folder), "--draft", "early-exit:30"]
    p = Pair(tmp_path_factory.mktemp("sharded"), worker_args=real,
             verifier_args=[*real, "--ranks", "2", "--shard-vocab", "--watchdog-ms", "60000",
                            "--rank-timeout-s", "120"],
             startup_s=STARTUP_S)
    yield p
    p.close()


def _one(pair, **body):
    return pair.generate_many([{"prompt": PROMPT, "max_tokens": 6, "seed": 5, **body}])[0]


def _accepts_nearly_all(answer) -> None:
    s = answer["stats"]
    assert not any(s["fallbacks"].values()), s
    assert s["drafted"] > 0 and s["accepted"] >= s["drafted"] - 1, s  # q ~ p: ~100%


def test_two_sharded_ranks_serve_a_real_model(pair, smol):
    a = _one(pair, top_k=None)  # dense q, scattered by slices; drafter = target
    assert a["token_ids"] == _one(pair, top_k=None)["token_ids"]  # same seed, same tokens
    assert a["text"] == smol.tokenizer.decode(
        a["token_ids"][:-1] if a["finish_reason"] == "stop" else a["token_ids"],
        skip_special_tokens=True)
    _accepts_nearly_all(a)
    # the target's temperature reaches every shard: a drafter at the same temperature
    # still proposes p itself (ranks sampling p at T = 1 would reject about half)
    _accepts_nearly_all(_one(pair, top_k=None, temperature=0.6, draft_temperature=0.6))
    sparse = _one(pair, top_k=32)
    greedy = _one(pair, temperature=0.0)
    target_only = _one(pair, speculative=False, temperature=0.7)
    assert all(1 <= len(r["token_ids"]) <= 6 for r in (sparse, greedy, target_only))
    assert value(rank_metrics(pair, 1), "pp1q_rank_decisions_total") >= 4  # rank 1 decides


def test_concurrent_requests_get_what_each_gets_alone(pair):
    # an exchange's steps run in one stacked forward on every rank (HFShard.prepare);
    # its rows differ from a lone forward's by ~1e-5, far from moving a keyed draw.
    # Target-only: a speculative answer also depends on the worker's q, whose own
    # batching may round its rows differently (still exact, not the same tokens)
    bodies = [{"prompt": PROMPT, "max_tokens": 8, "seed": s, "speculative": False,
               "temperature": 0.8} for s in (11, 12)]
    alone = [pair.generate_many([b])[0]["token_ids"] for b in bodies]
    together = [a["token_ids"] for a in pair.generate_many(bodies, concurrency=2)]
    assert together == alone


def test_top_p_is_served_and_a_top_k_over_the_limit_is_refused_and_counted(pair):
    from pp1q_kernels.shard_processors import MAX_SHARD_TOP_K

    a = _one(pair, top_k=None, top_p=0.9, target_top_k=40)
    assert a["token_ids"] == _one(pair, top_k=None, top_p=0.9, target_top_k=40)["token_ids"]
    assert not any(a["stats"]["fallbacks"].values()), a["stats"]
    with pytest.raises(ApiError) as e:
        _one(pair, target_top_k=MAX_SHARD_TOP_K + 1)
    assert (e.value.status, e.value.code) == (422, "unsupported_processors")
    m = pair.metrics("verifier")
    assert value(m, "pp1q_requests_refused_total", reason="unsupported_processors") == 1
