"""The real-model soak's pieces that need no model (pp1q.tools.chaos.real_soak, text_mix,
load): its defaults against the daemons' own, the toy's request mix drawn exactly as
before, how a request read to its end is judged on each model, the stop-string check of
a streamed text answer, and the first worker's RSS before its kill in the report."""

from __future__ import annotations

import random
import threading
import time

import pytest

from pp1q.models.engine import PREFILL_CHUNK
from pp1q.runtime.settings import VerifierSettings
from pp1q.tools.chaos import leave
from pp1q.tools.chaos.load import Load
from pp1q.tools.chaos.real_soak import real_config
from pp1q.tools.chaos.soak import SoakConfig
from pp1q.tools.chaos.soak_report import RSS_GROWTH_BOUND_KIB, SoakReport
from pp1q.tools.chaos.text_mix import TEXTS, TextRequest, draw_text
from pp1q.tools.client import ApiError

MODEL = ("--model", "embedded")
DRAWS = 40  # requests drawn per check: each kind of draw among them


def test_real_defaults_are_the_daemons_and_reach_past_one_prefill_chunk():
    cfg = real_config(600, MODEL)
    real = VerifierSettings(model="embedded")
    assert cfg.watchdog_ms / 1000 == real.step_timeout_s  # the daemons' real default
    assert cfg.watchdog_ms / 1000 != VerifierSettings().step_timeout_s  # not the toy's
    assert cfg.prompt_ids[1] > PREFILL_CHUNK and cfg.concurrency == 4
    assert cfg.model == MODEL and cfg.text_p > 0
    # a text prompt of every sentence is past one chunk too (~4 characters a token)
    assert len(" ".join(TEXTS)) > 4 * PREFILL_CHUNK
    assert real_config(60, MODEL, hang_s=5.0).hang_s == 5.0  # an option overrides


def _drawn(cfg, n: int = DRAWS) -> list[tuple]:
    """The first ``n`` requests one load thread sends, as (kind, args), none sent."""
    stop = threading.Event()
    load = Load("http://127.0.0.1:1", cfg, stop)
    out: list[tuple] = []

    def record(kind):
        def send(*args):
            out.append((kind, *args[1:]))  # past the client (or the leaving plan)
            if len(out) >= n:
                stop.set()
        return send

    load._one, load._text, load._leave = record("one"), record("text"), record("leave")
    load._run(0)
    return out


def test_the_toy_mix_is_drawn_as_before():
    """The draws the toy soak made before the real model's fields existed: ids, length,
    support, seed, in that order, from one generator (the leaving ones apart)."""
    cfg = SoakConfig(seconds=1, abandon_p=0.0)
    rng = random.Random(cfg.seed * 1000)
    want = []
    for _ in range(DRAWS):
        prompt = [rng.randrange(cfg.vocab) for _ in range(rng.randint(2, 16))]
        n = rng.randint(4, 48)
        top_k = rng.choice(cfg.top_ks)
        want.append(("one", prompt, n, rng.getrandbits(64), top_k))
    assert _drawn(cfg) == want


def test_a_real_mix_sends_text_and_long_id_prompts():
    drawn = _drawn(real_config(1, MODEL, abandon_p=0.0), 4 * DRAWS)
    texts = [d for d in drawn if d[0] == "text"]
    ids = [d for d in drawn if d[0] == "one"]
    assert texts and ids
    assert all(isinstance(d[1], TextRequest) for d in texts)
    assert any(d[1].stop for d in texts) and any(d[1].stop is None for d in texts)
    assert any(len(d[1]) > PREFILL_CHUNK for d in ids)
    assert all(4 <= d[2] <= 24 for d in drawn)


def _load(model=()) -> Load:
    return Load("http://127.0.0.1:1", SoakConfig(seconds=1, model=model), threading.Event())


@pytest.mark.parametrize("model,finish,got,fails", [
    ((), "length", 8, False),
    ((), "stop", 5, True),  # the toy has no EOS: short is short
    (MODEL, "stop", 5, False),  # a real target's EOS or a stop string
    (MODEL, "length", 5, True),
    (MODEL, "stop", 9, True),  # more than asked
])
def test_a_request_read_to_its_end_is_judged_by_its_model(model, finish, got, fails):
    load = _load(model)
    load._done(got, 8, finish, 0.0)
    assert bool(load.failed) == fails, load.failed
    assert load.requests == 1 and load.tokens == got


class _Streams:
    """A client whose streamed answer is given: each event's text and ids."""

    def __init__(self, pieces, finish="stop") -> None:
        self.pieces, self.finish, self.bodies = pieces, finish, []

    def stream(self, prompt, max_tokens, **body):
        self.bodies.append((prompt, max_tokens, body))
        for i, (text, ids) in enumerate(self.pieces):
            last = i == len(self.pieces) - 1
            yield {"choices": [{"text": text, "token_ids": ids,
                                "finish_reason": self.finish if last else None}]}


def test_a_text_answer_holding_its_stop_string_fails():
    load = _load(MODEL)
    client = _Streams([("Paris", [1]), (" is.", [2, 3])])
    load._text(client, TextRequest("Question?", "."), 8, 1 << 63, 8)
    assert load.failed == ["stop string '.' in the answer's text 'Paris is.'"]
    prompt, n, body = client.bodies[0]
    assert (prompt, n, body["stop"]) == ("Question?", 8, ["."])
    assert body["seed"] == leave.openai_seed(1 << 63) < 0  # int64 on the OpenAI route
    assert body["pp1q"] == {"speculative": True, "draft_top_k": 8}


def test_a_text_answer_ending_before_its_stop_string_passes():
    load = _load(MODEL)
    load._text(_Streams([("Paris", [1]), (" is", [2])]), TextRequest("Q?", "."), 8, 3, None)
    assert load.failed == [] and load.requests == 1 and load.tokens == 2
    assert load.texts == 1 and load.stopped == 1  # 2 ids of 8, "stop"


def test_a_text_request_that_fails_is_counted_failed():
    class Refusing:
        def stream(self, *a, **k):
            raise ApiError(500, "internal", "boom")
            yield  # a generator, as Client.stream

    load = _load(MODEL)
    load._text(Refusing(), TextRequest("Q?", None), 8, 3, None)
    assert load.failed and "boom" in load.failed[0] and load.requests == 0


def test_draw_text_is_consecutive_sentences():
    rng = random.Random(0)
    for _ in range(DRAWS):
        req = draw_text(rng)
        assert req.text.split(" ")[0] in {t.split(" ")[0] for t in TEXTS}


def test_the_first_workers_rss_before_its_kill_is_checked():
    """Past a crash the end figure is a newer worker's, not checked; a real-model soak
    reads the first worker just before its kill, and that figure is."""
    warm = 500 * 1024
    report = SoakReport(requests=1, worker_restarts=1,
                        rss_kib={"worker": (400 * 1024, warm, warm)})
    assert report.problems() == []
    report.worker_killed_rss_kib = warm + RSS_GROWTH_BOUND_KIB + 1
    assert report.problems() == ["worker RSS grew 32.0 MiB after warm-up (bound 32 MiB)"]
    assert "the first worker before its kill" in report.format()


def test_rss_growth_is_not_checked_when_the_warm_up_never_ended():
    """A run shorter than its warm-up (`pp1q soak --model embedded` at the default 60 s
    completes a few requests) has no baseline: its start figure holds no model's first
    rounds, and a 1 s run grew 500 MiB from it. Said, not failed; with the warm-up done
    the same growth fails."""
    start = 600 * 1024
    grown = {"verifier": (start, start, start + 500 * 1024)}
    report = SoakReport(requests=4, rss_kib=grown, warmed=False, warmup_requests=80)
    assert report.problems() == []
    assert "growth not checked: the run ended before the warm-up's 80 requests" in (
        report.format())
    report.warmed = True
    assert report.problems() == ["verifier RSS grew 500.0 MiB after warm-up (bound 32 MiB)"]


class _CountingEvent(threading.Event):
    """The warm-up's end, counting how often the chaos thread asked for it."""

    asked = 0

    def is_set(self) -> bool:
        self.asked += 1
        return super().is_set()


class _Rig:
    """What the chaos thread does to the rig, recorded (no stream fault is drawn here)."""

    def __init__(self) -> None:
        self.did: list[str] = []

    def crash_worker(self) -> None:
        self.did.append("crash")

    def restart_worker(self) -> None:
        self.did.append("restart")

    def rss_kib(self, role: str) -> int:
        return 1000


ASKS = 50  # times the chaos thread finds its crash due and the warm-up not over
WAIT_LOOPS = 10_000  # bounded polls of the chaos thread's progress (1 ms each)


def _until(cond) -> None:
    for _ in range(WAIT_LOOPS):
        if cond():
            return
        time.sleep(0.001)
    raise AssertionError("the chaos thread did not get there")


def test_a_real_models_first_crash_waits_for_the_warm_up(monkeypatch):
    """The first crash, due long before, comes only once the RSS baseline is read; then
    the first worker's RSS is read just before its kill."""
    from pp1q.tools.chaos import soak
    from pp1q.tools.chaos.crash_window import CrashWindow

    monkeypatch.setattr(soak, "WARM_POLL_S", 0.001)
    cfg = real_config(1, MODEL, crash_every_s=0.001, stream_fault_mean_s=1e9)
    rig, stop, warmed, restarts, killed = _Rig(), threading.Event(), _CountingEvent(), [0], []
    failures: list[BaseException] = []
    chaos = threading.Thread(target=soak._chaos_thread, args=(
        failures, rig, cfg, random.Random(0), stop, restarts, CrashWindow(), killed, warmed))
    chaos.start()
    try:
        _until(lambda: warmed.asked >= ASKS or failures)
        assert rig.did == [] and killed == [] and not failures
        warmed.set()
        _until(lambda: restarts[0] >= 1 or failures)
        assert rig.did[:2] == ["crash", "restart"] and killed == [1000] and not failures
    finally:
        stop.set()
        chaos.join(10)
