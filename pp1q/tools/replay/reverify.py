"""Re-deciding captured rounds: the target's p, the validated q, the same keyed draws.

The prefix of each (session, slot) comes from the captured CONTEXT frames (start 0
opens it, start > 0 appends a fallback's token) and grows by every COMMIT, as on the
worker; each STEP's ``prefix_digest`` must match it. A
validated proposal is then decided again exactly as the verifier daemon decides
(pp1q.verifier.rounds: standard verification for sampled rounds, argmax for greedy
ones) and the captured COMMIT must carry the same accepted count and token.

Keys: the verifier's draws are keyed by its draw seed (pp1q.core.drawkey), which a
capture does not contain; it records the secret's fingerprint only, and re-deciding
needs the secret itself (``pp1q replay --reverify --draw-secret-file FILE``). A capture
without a ``draw_key`` INFO entry predates verifier-owned draws: every draw was keyed
by the request seed, and ``draws=None`` re-decides it that way. A worker's capture
records the entry without a fingerprint: the worker never learns the secret.
"""

from __future__ import annotations

from dataclasses import dataclass

from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import ConfigError
from pp1q.core.prefix import Prefix
from pp1q.core.verify import RoundKeys
from pp1q.models.toy import TargetModel, ToySpec, ToyTarget
from pp1q.tools.replay.vector_models import TARGET_PREFIX, VectorTarget, parse_identity
from pp1q.verifier import rounds
from pp1q.wire import Commit, Step
from pp1q.wire.events import ProposalReady

TOY_TARGET_PREFIX = "toy-target-v1"
DRAW_KEY_INFO = "draw_key"  # the capture INFO entry naming the draw secret (fingerprint)


def draws_for(meta: dict | None, draws: DrawKeys | None) -> DrawKeys | None:
    """Check ``draws`` against a capture's ``draw_key`` INFO entry (None: the capture
    has none, so it predates verifier-owned draws). ConfigError when they do not fit."""
    if meta is None:
        if draws is not None:
            raise ConfigError("this capture predates verifier-owned draws (no draw_key): "
                              "re-decide it without a draw secret")
        return None
    want = meta.get("fingerprint")  # None: a worker's capture (it never knows the secret)
    if draws is None:
        raise ConfigError(f"this capture's draws are keyed by a verifier secret "
                          f"(fingerprint {want or 'not known to the worker'}): pass "
                          f"--draw-secret-file")
    if want is not None and draws.fingerprint != want:
        raise ConfigError(f"the draw secret's fingerprint {draws.fingerprint} is not the "
                          f"capture's {want}")
    return draws


def target_from_identity(target_id: str) -> TargetModel | None:
    """Rebuild a target named in HELLO, if it is one pp1q ships (toy or vector toy)."""
    parsed = parse_identity(target_id)
    if parsed is None:
        return None
    name, vocab, seed = parsed
    if name == TOY_TARGET_PREFIX:
        return ToyTarget(ToySpec(vocab=vocab, seed=seed))
    if name == TARGET_PREFIX:
        return VectorTarget(vocab, seed)
    return None


@dataclass(frozen=True)
class Recheck:
    """Outcome of re-deciding one round (``problem`` empty when it matched)."""

    key: tuple  # (session, slot, generation, round_id)
    accepted: int
    token: int
    problem: str = ""


class Reverifier:
    def __init__(self, target: TargetModel, draws: DrawKeys | None) -> None:
        self.target = target
        self.draws = draws  # None: a capture from before verifier-owned draws
        self._prefixes: dict[tuple, Prefix] = {}  # (session, slot) -> committed prefix
        self._pending: dict[tuple, tuple[list[int], rounds.Outcome]] = {}
        self.checked = 0
        self.skipped = 0  # validated rounds whose prefix the capture does not show

    def on_context(self, session: int, slot: int, start: int, tokens) -> None:
        key = (session, slot)
        held = self._prefixes.get(key)
        if start == 0:
            self._prefixes[key] = Prefix(tokens)
        elif held is not None and len(held) == start:
            held.extend(tokens)
        else:  # an append to a prefix the capture does not show: nothing to re-decide after
            self._prefixes.pop(key, None)

    def on_ready(self, session: int, step: Step, ev: ProposalReady) -> str:
        """Decide the round now; returns a problem description, or "" if none."""
        prefix = self._prefixes.get((session, step.slot))
        if prefix is None:  # e.g. a capture that began after the request's CONTEXT
            self.skipped += 1
            return ""
        if prefix.digest != step.prefix_digest:
            return (f"STEP prefix_digest {step.prefix_digest:016x} != digest of the tracked "
                    f"prefix {prefix.digest:016x}")
        drafts = list(ev.draft_ids)
        if ev.greedy:
            out = rounds.greedy(self.target.logits(prefix.tokens, drafts), drafts)
        else:
            p = self.target.probs(prefix.tokens, drafts)
            seed = step.seed if self.draws is None else self.draws.seed_for(step.seed)
            keys = RoundKeys(seed, step.generation, step.round_id, step.first_position)
            out = rounds.sampled(p, ev.q_rows, drafts, keys)
        self._pending[(session, step.slot, step.generation, step.round_id)] = (drafts, out)
        return ""

    def on_commit(self, commit: Commit) -> Recheck | None:
        """Compare a captured COMMIT with the re-decision; None if it was not re-decided."""
        key = (commit.session, commit.slot, commit.generation, commit.round_id)
        pending = self._pending.pop(key, None)
        if pending is None:
            return None
        drafts, out = pending
        self.checked += 1
        prefix = self._prefixes.get(key[:2])
        if prefix is None:
            return None
        prefix.extend(drafts[:commit.accepted] + [commit.token])
        if (out.accepted, out.token) != (commit.accepted, commit.token):
            return Recheck(key, out.accepted, out.token,
                           f"captured accepted={commit.accepted} token={commit.token}, "
                           f"re-decided accepted={out.accepted} token={out.token}")
        return Recheck(key, out.accepted, out.token)
