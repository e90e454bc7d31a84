"""The engine seam: what the worker needs from a drafter and the verifier from a target.

Both roles are per-request and stateful, because every real engine keeps a KV cache:

* ``Drafter`` is autoregressive and incremental. Row i of a proposal depends on every
  token before it (committed prefix and x_1..x_{i-1}), so the worker asks for one row
  at a time: ``next_logits(req)`` for x_1, then ``next_logits(req, x_i)`` after sampling
  each x_i. ``append(req, x_D)`` records the last draft (no row is needed after it, so
  no forward is spent on it; it is fed lazily if it is accepted). A long committed
  prefix is opened in chunks too: ``open(req, first)`` then ``extend(req, next)`` (the
  worker's EngineProposer, yielding its event loop between two chunks).
* ``Target`` scores all requests of a round in one call: ``score([(req, drafts), ...])``
  returns, per request, logits [len(drafts) + 1, V] on the model's device, where row i
  is conditioned on the committed prefix + drafts[:i]. ``score(... [])`` is a
  target-only step (one row). A long prompt is opened in chunks: ``open(req, first)``
  then ``extend(req, next)`` per chunk of ``PREFILL_CHUNK`` ids (the verifier's
  EngineDecider: other requests' rounds run between the chunks, and a request whose
  client left stops after the chunk in hand instead of prefilling the rest).

Both end a round the same way: ``commit(req, accepted, token)`` keeps the first
``accepted`` speculative tokens plus the correction/bonus ``token`` and rolls the KV
cache back over the rest; ``reset(req)`` drops speculative state only (a discarded
round); ``close(req)`` frees the request. Logits are float32 or float64 torch tensors
on the engine's ``device`` (a target's rounds are decided there: EngineDecider refuses
logits found elsewhere); turning them into q (pp1q.q.build_row) or into p
(processors.processed_probs) is the caller's job, so the q shipped is always built from
exactly the logits returned here.

Each engine names itself for HELLO: ``identity`` (checkpoint digest, plus early-exit
depth and the like), ``tokenizer_digest`` (digest of the id -> token map) and ``vocab``
(the logits width). ``check_pair`` refuses a drafter/target pair that would draft in a
different id space: same ids meaning different strings is silent garbage, not an error
anything downstream can see.
"""

from __future__ import annotations

import abc
from collections.abc import Hashable, Sequence

import torch

from pp1q.core.errors import LocalProtocolError, Reason

RequestKey = Hashable  # whatever the daemon uses to name a request (an int, a tuple...)

# ids one prefill call takes, on both sides (``open`` then ``extend`` per chunk): ~0.3-1.4 s
# of SmolLM2-135M on a 2-core CPU, about what the other requests then wait behind a
# long prompt. In chunks a 4,096-id prefill costs the whole prompt's CPU with one torch
# thread (0.98-1.08x) and 1.16-1.45x with two; 256-id chunks 0.96-1.25x there, for longer
# waits beside them (BENCHMARKS.md, "Chunked prefill": kept at 128, a trade to choose)
PREFILL_CHUNK = 128


def lookup(table: dict, request: RequestKey):
    """``table[request]``, or the refusal every engine gives for a request never opened."""
    try:
        return table[request]
    except KeyError:
        raise LocalProtocolError(Reason.STATE_NOT_ALLOWED, f"unknown request {request!r}") from None


class Engine(abc.ABC):
    """What HELLO and the metrics need to know about a model, whichever role it plays."""

    identity: str  # checkpoint digest (+ how it is used, e.g. early-exit depth)
    tokenizer_digest: str  # digest of the id -> token map; pairs must agree
    vocab: int  # width of every logits row
    variant: str = ""  # run-time knobs that change numerics, not the checkpoint (metrics)
    # where its logits are: a target's rounds are decided there (EngineDecider), so its
    # p never crosses to the host
    device: torch.device = torch.device("cpu")

    @abc.abstractmethod
    def close(self, request: RequestKey) -> None:
        """Free everything held for ``request`` (unknown requests are ignored)."""


class Drafter(Engine):
    """An autoregressive, incremental drafter (see the module docstring)."""

    @abc.abstractmethod
    def open(self, request: RequestKey, committed: Sequence[int]) -> None:
        """Start ``request`` from its committed token ids (at least one)."""

    @abc.abstractmethod
    def extend(self, request: RequestKey, committed: Sequence[int]) -> None:
        """Append the next ``committed`` ids of an opened request (a chunked prefill) and
        cache them as ``open`` does; refused with speculative tokens held."""

    @abc.abstractmethod
    def append(self, request: RequestKey, token: int) -> None:
        """Record a sampled speculative token without computing the row after it."""

    @abc.abstractmethod
    def next_logits(self, request: RequestKey, token: int | None = None) -> torch.Tensor:
        """Logits [V] for the next position, after appending ``token`` if given.

        ``token=None`` gives the row after everything recorded so far: the first row
        of a round (conditioned on the committed prefix).
        """

    @abc.abstractmethod
    def commit(self, request: RequestKey, accepted: int, token: int) -> None:
        """Keep the first ``accepted`` speculative tokens and ``token``; drop the rest."""

    @abc.abstractmethod
    def reset(self, request: RequestKey) -> None:
        """Drop speculative tokens and their cache; the committed prefix stays."""

    def kv_bytes(self, request: RequestKey) -> int:
        """Memory ``request``'s cache holds now (0 for an unknown request, or a drafter
        that keeps none): what the worker's K/V budget counts."""
        return 0


class Target(Engine):
    """A target that scores a round's requests in one batch (see the module docstring)."""

    @abc.abstractmethod
    def open(self, request: RequestKey, prompt: Sequence[int]) -> None:
        """Start ``request`` from its prompt ids (at least one) and cache them."""

    @abc.abstractmethod
    def extend(self, request: RequestKey, prompt: Sequence[int]) -> None:
        """Append the next ``prompt`` ids of an opened request before its first round
        (a chunked prefill) and cache them as ``open`` does; refused with drafts held."""

    @abc.abstractmethod
    def score(self, batch: Sequence[tuple[RequestKey, Sequence[int]]]) -> list[torch.Tensor]:
        """Per (request, drafts): logits [len(drafts) + 1, V]; row i sees drafts[:i].

        Scoring a request again before its commit replaces the earlier drafts.
        """

    @abc.abstractmethod
    def commit(self, request: RequestKey, accepted: int, token: int) -> None:
        """Keep the first ``accepted`` scored drafts and ``token``; roll back the rest."""

    @abc.abstractmethod
    def reset(self, request: RequestKey) -> None:
        """Forget the last scored drafts (a discarded round); committed tokens stay."""


def make_current(device: str | torch.device | None) -> None:
    """Make a numbered CUDA ``device`` the calling thread's current one (a CPU, a plain
    ``cuda`` or None is left as it is). Our tensors name their device, but what uses the
    current one does not: page-locked host memory (the worker's staging), a bare
    synchronize, Triton's launches. CUDA keeps the current device per thread, so every
    thread that runs a model calls this (the loading thread, EngineDecider's executor, a
    follower rank's thread after its join, rank 0's exchange thread: ``on_device``): left
    at cuda:0, a rank or daemon on cuda:1 would open a context on a GPU that is not its
    own (hundreds of MB there) and wait on the wrong device. (A rank's ``cuda`` is its
    own ``cuda:r``: pp1q.verifier.daemon.rank_device.)"""
    if device is None:
        return
    where = torch.device(device)
    if where.type == "cuda" and where.index is not None:  # plain "cuda": the current one
        torch.cuda.set_device(where)


def on_device(device: str | torch.device | None, fn, *args):
    """``fn(*args)`` after ``make_current(device)``: the entry of a thread that runs a
    model (rank 0's exchange thread)."""
    make_current(device)
    return fn(*args)


def check_pair(drafter: Engine, target: Engine) -> None:
    """Refuse a pair whose ids mean different things (or whose rows differ in width)."""
    if drafter.tokenizer_digest != target.tokenizer_digest:
        raise LocalProtocolError(
            Reason.TOKENIZER_MISMATCH,
            f"drafter {drafter.identity} tokenizer {drafter.tokenizer_digest} != "
            f"target {target.identity} tokenizer {target.tokenizer_digest}",
        )
    if drafter.vocab != target.vocab:
        raise LocalProtocolError(
            Reason.TOKENIZER_MISMATCH,
            f"drafter vocab {drafter.vocab} != target vocab {target.vocab}",
        )
