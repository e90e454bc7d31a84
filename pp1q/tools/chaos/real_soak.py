"""The soak on the embedded real model (``pp1q soak --model embedded``): SmolLM2-135M as
the target, its first layers drafting with the exit adapter (the daemons' default
drafter, pp1q.tools.realmodel.model_args), and a request mix that reaches the real
model's per-request state: prompts past one 128-id prefill chunk (the target's chunked
prefill, the prompt sent ahead to the worker, the drafter's K/V), text prompts streamed
back through the incremental detokenizer, some with a stop string (pp1q.tools.chaos.text_mix).

The toy soak's defaults are the toy's; these are the real model's, each with its reason.
"""

from __future__ import annotations

from pp1q.models.engine import PREFILL_CHUNK
from pp1q.runtime.settings import REAL_MODEL_WATCHDOG_MS
from pp1q.tools.chaos.soak import SoakConfig

REAL_VOCAB = 49152  # SmolLM2-135M's vocabulary: random id prompts are drawn from it
# id prompts: 2 ids up to past two prefill chunks, so a share of them take the target's
# chunked prefill (and the worker's prefill of the prompt sent ahead) in 2-3 chunks
REAL_PROMPT_IDS = (2, 2 * PREFILL_CHUNK + 40)
REAL_MAX_TOKENS = (4, 24)  # a few rounds each: ~1-4 s a request on the 2 shared cores
REAL_TEXT_P = 0.4  # requests with a text prompt, streamed, some with a stop string
# the RSS baseline: the first requests fault in torch's pools and grow the heap to the
# largest K/V the mix has held at once (glibc keeps freed heap up to 512 MiB mapped:
# pp1q.runtime.malloc), so RSS climbs in steps until the mix has drawn its long prompts
# together. Measured on the 2 shared cores (10 minutes): after 30 requests the verifier
# still grew 39 MiB, then stayed flat from the 68th request to the 123rd
REAL_WARMUP_REQUESTS = 80
# stream faults hold 2 x the watchdog (40 s at the real default): the toy's 8 s mean gap
# would keep the wire paused most of the time; one every two minutes on average leaves
# most of the run speculating between them
REAL_STREAM_FAULT_MEAN_S = 120.0
REAL_ABANDON_P = 0.05  # a real request takes seconds: 2.5 x the toy's share, ~9 in 10 min here
# a request the verifier no longer moves: the slowest of the mix, through a 40-s stream
# fault (the watchdog firing at 20 s, then the breaker open) or a worker restart (the
# model loaded again), took 83 s and 108 s in two 10-12-minute runs on the 2 shared cores
REAL_HANG_S = 240.0
# the worker's kill period; the first waits for the warm-up's end (80 requests took ~7
# minutes here) so that the first worker's RSS growth is read just before its kill
REAL_CRASH_EVERY_S = 300.0


def real_config(seconds: float, model: tuple[str, ...], **overrides) -> SoakConfig:
    """The real-model soak's configuration: ``model`` the daemons' model options,
    ``overrides`` any SoakConfig field."""
    fields = dict(seconds=seconds, model=model, vocab=REAL_VOCAB,
                  watchdog_ms=REAL_MODEL_WATCHDOG_MS, target_delay_ms=0.0,
                  prompt_ids=REAL_PROMPT_IDS, max_tokens=REAL_MAX_TOKENS, text_p=REAL_TEXT_P,
                  warmup_requests=REAL_WARMUP_REQUESTS,
                  stream_fault_mean_s=REAL_STREAM_FAULT_MEAN_S, abandon_p=REAL_ABANDON_P,
                  hang_s=REAL_HANG_S, crash_every_s=REAL_CRASH_EVERY_S)
    return SoakConfig(**{**fields, **overrides})
