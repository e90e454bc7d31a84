"""How a verifier process joins a rank group (``--ranks N``): the launch forms.

- **spawn**: ``pp1q verifier --ranks N`` with no ``--rank`` (and no torchrun variables):
  this process is rank 0. It hosts the rendezvous store at ``--rank-master`` (default
  127.0.0.1:0, any free port) and starts ranks 1..N-1 itself, as child processes of the
  same command with ``--rank i``; their output goes to its stderr.
- **explicit**: ``--ranks N --rank R --rank-master HOST:PORT`` on each process, one
  machine or several (systemd units, deploy/): rank 0 hosts the store at HOST:PORT, the
  others dial it. Start them in any order within ``rank_join_timeout_s``.
- **torchrun**: ``torchrun --nproc-per-node N -m pp1q.cli verifier ...``: rank, world
  size and rendezvous come from torchrun's environment (``env://``).

At join every rank publishes an identity record (pp1q version, target, vocabulary,
slots, depth, row bounds) and every rank refuses a group whose records differ (exit
status 2, naming the key), before any request is served. Rank 0's record also carries
the verifier's draw secret (pp1q.core.drawkey): every rank takes it from there
(``share_draw_secret``) and drops it from the records before anything keeps or shows
them; it is never in an op, a log line or a setting a spawned rank inherits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, replace

from pp1q import __version__
from pp1q.core.drawkey import DrawKeys
from pp1q.core.errors import ConfigError
from pp1q.runtime.config import option_of
from pp1q.runtime.settings import MAX_RANKS, VerifierSettings, cannot_listen, parse_hostport
from pp1q.verifier.ranks.collective import Collective, Rendezvous, make_store
from pp1q.verifier.ranks.ops import Limits

log = logging.getLogger("pp1q.verifier.ranks.group")

CHILD_POLL_S = 0.2  # how often rank 0 looks at its spawned ranks while the group forms
CHILD_STOP_S = 10.0  # spawned ranks get this long to exit after the group stops
# settings a spawned rank inherits from rank 0 (the rest concern rank 0 alone)
CHILD_KEYS = ("vocab", "model_seed", "slots", "depth", "target_delay_ms", "log_level",
              "metrics_host", "ranks", "rank_timeout_s", "rank_join_timeout_s",
              "rank_backend", "rank_exit_grace_s", "shard_vocab", "shard_kv_budget_bytes",
              "model", "draft", "draft_model", "device", "dtype", "gguf_cache")
IDENTITY_KEYS = ("pp1q", "target", "vocab", "slots", "depth", "dense_len", "max_support",
                 "backend", "sharded", "dtype")


@dataclass(frozen=True)
class RankPlan:
    rv: Rendezvous
    spawn: bool  # rank 0 starts the other ranks itself


def rank_plan(settings: VerifierSettings, environ=None) -> RankPlan | None:
    """None for a single-process verifier; ConfigError for rank settings that disagree
    with each other or with torchrun's environment (each is in range: the struct)."""
    environ = os.environ if environ is None else environ
    ranks, rank = settings.ranks, settings.rank
    if rank is None and "RANK" in environ and "WORLD_SIZE" in environ:  # torchrun
        try:
            world, rank = int(environ["WORLD_SIZE"]), int(environ["RANK"])
            local = int(environ.get("LOCAL_RANK", rank))
            local_world = int(environ.get("LOCAL_WORLD_SIZE", world))
        except ValueError:
            raise ConfigError("torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE "
                              "must be integers") from None
        if ranks not in (1, world):
            raise ConfigError(f"--ranks {ranks} but torchrun's WORLD_SIZE is {world}")
        master, spawn = None, False
    else:
        world = ranks
        if world == 1:
            if rank not in (None, 0):
                raise ConfigError(f"--rank {rank} needs --ranks > {rank}")
            return None
        spawn = rank is None
        rank = 0 if spawn else rank
        master = parse_hostport(settings.rank_master)
        if not spawn and master[1] == 0:
            raise ConfigError("--rank-master needs a fixed port when each rank is started "
                              "with --rank (0 picks one only for ranks spawned by rank 0)")
        local = rank if spawn else int(environ.get("LOCAL_RANK", 0))
        local_world = world if spawn else 1
    if not 1 <= world <= MAX_RANKS:
        raise ConfigError(f"ranks {world} outside 1..{MAX_RANKS}")
    if not 0 <= rank < world:
        raise ConfigError(f"rank {rank} outside 0..{world - 1}")
    backend = _backend(settings.rank_backend, local_world)
    return RankPlan(Rendezvous(rank, world, master, backend, settings.rank_join_timeout_s,
                               settings.rank_timeout_s, local), spawn)


def _backend(name: str, local_ranks: int) -> str:
    if name != "auto":
        return name
    import torch

    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_ranks
    return "nccl" if cuda else "gloo"


def limits_of(config, world: int, sharded: bool = False) -> Limits:
    """Exchange bounds from the verifier's wire configuration (pp1q.wire.session_config);
    ``sharded``: --shard-vocab (pp1q.verifier.ranks.sharded)."""
    lim = config.limits
    return Limits(world=world, slots=lim.max_slots, depth=lim.max_depth,
                  vocab=config.identity.vocab, dense_len=lim.dense_len,
                  max_support=lim.max_support, sharded=sharded)


def identity(target, limits: Limits, backend: str, metrics: str | None) -> dict:
    """``target``: the rank's target (its identity; a real model's shard also its dtype:
    ranks computing their rows at different precisions would mix two p's in one row)."""
    return {"pp1q": __version__, "target": target.identity,
            "dtype": getattr(target, "dtype", None), "vocab": limits.vocab,
            "slots": limits.slots, "depth": limits.depth, "dense_len": limits.dense_len,
            "max_support": limits.max_support, "backend": backend, "metrics": metrics,
            "sharded": limits.sharded}


def check_identities(records: list[dict]) -> None:
    """Every rank runs this on the same records: all refuse together or none does."""
    for key in IDENTITY_KEYS:
        values = [r.get(key) for r in records]
        if any(v != values[0] for v in values):
            shown = ", ".join(f"rank {i}: {v!r}" for i, v in enumerate(values))
            raise ConfigError(f"verifier ranks disagree on {key} ({shown})")


DRAW_SECRET = "draw_secret"  # rank 0's identity record only


def share_draw_secret(records: list[dict]) -> DrawKeys:
    """Every rank: the group's draw secret from rank 0's record, removed from all."""
    secret = records[0].pop(DRAW_SECRET, None)
    for r in records[1:]:
        r.pop(DRAW_SECRET, None)
    if not isinstance(secret, str):
        raise ConfigError("rank 0 sent no draw secret at join")
    return DrawKeys.from_hex(secret)


def join(rv: Rendezvous, limits: Limits, store, record: dict) -> tuple[Collective, list[dict]]:
    """Blocking: form the group, exchange identity records (not yet checked)."""
    coll = Collective(rv, limits, store)
    return coll, coll.identities(json.dumps(record, sort_keys=True).encode())


# ---------------------------------------------------------------------------
# rank 0


class Children:
    """Ranks 1..N-1 spawned by rank 0 (the spawn form)."""

    def __init__(self, command: list[str], settings: VerifierSettings, rv: Rendezvous) -> None:
        host, port = rv.master
        self.procs: dict[int, subprocess.Popen] = {}
        for r in range(1, rv.world):
            args = [*command, "--rank", str(r), "--rank-master", f"{host}:{port}"]
            for key in CHILD_KEYS:
                v = getattr(settings, key)
                if v is None:  # unset (draft_model, gguf_cache): the default
                    continue
                if isinstance(v, bool):  # a --flag / --no-flag pair
                    args.append(option_of(key) if v else option_of(f"no_{key}"))
                else:
                    args += [option_of(key), str(v)]
            mport = settings.metrics_port
            if mport is not None:  # a fixed metrics port P gives rank r the port P + r
                args += ["--metrics-port", str(mport + r if mport else 0)]
            self.procs[r] = subprocess.Popen(args, stdout=sys.stderr, stdin=subprocess.DEVNULL)

    def exited(self) -> dict[int, int]:
        return {r: p.returncode for r, p in self.procs.items() if p.poll() is not None}

    def reap(self, timeout: float = CHILD_STOP_S) -> None:
        """Wait for every child (they exit on STOP or on losing the group), then kill."""
        for r, p in self.procs.items():
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("rank %d did not exit; killing it", r)
                p.kill()
                p.wait()


class Launch:
    """Rank 0 before the group forms: the rendezvous store's listening socket, bound
    first thing (a port in use fails at once, and port 0 becomes a real port), and the
    spawned ranks, started at once so that they import and build while rank 0 does."""

    def __init__(self, plan: RankPlan, settings: VerifierSettings,
                 child_command: list[str]) -> None:
        rv, self.children, self.listen_fd = plan.rv, None, None
        if rv.master is not None:
            host, port = rv.master
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            try:
                sock = socket.create_server((host, port), family=family)
            except OSError as e:
                raise cannot_listen("rank_master", f"{host}:{port}", e) from None
            rv = replace(rv, master=(host, sock.getsockname()[1]))
            self.listen_fd = sock.detach()  # the store owns it from here on
        self.plan = replace(plan, rv=rv)
        if plan.spawn:
            self.children = Children(child_command, settings, rv)

    def abandon(self) -> None:
        """The group will not form (a settings error, a signal): stop spawned ranks."""
        if self.listen_fd is not None:
            os.close(self.listen_fd)
            self.listen_fd = None
        if self.children is not None:
            for p in self.children.procs.values():
                if p.poll() is None:
                    p.terminate()
            self.children.reap()


async def form_group(launch: Launch, limits: Limits, record: dict, stop: asyncio.Event):
    """Rank 0: create the store, join, check identities. Returns (collective, identity
    records); ConfigError on a settings mismatch or a spawned rank that exits first,
    TimeoutError when the ranks did not all join in time. The launch is abandoned on
    any error."""
    rv, children = launch.plan.rv, launch.children
    loop = asyncio.get_running_loop()
    joined: asyncio.Future = loop.create_future()

    def run() -> None:
        try:
            store = None
            if rv.master is not None:
                store = make_store(*rv.master, rv.world, True, rv.join_timeout_s,
                                   listen_fd=launch.listen_fd)
                launch.listen_fd = None
            result = join(rv, limits, store, record)
        except Exception as e:  # noqa: BLE001 - reported on the loop, whatever it is
            loop.call_soon_threadsafe(_settle, joined, None, e)
        else:
            loop.call_soon_threadsafe(_settle, joined, result, None)

    # a daemon thread: a join abandoned (a rank exited, SIGTERM) must not block exit
    threading.Thread(target=run, name="pp1q-rank-join", daemon=True).start()
    try:
        while not joined.done():
            await asyncio.wait({joined}, timeout=CHILD_POLL_S)
            if stop.is_set():
                raise ConfigError("stopped while the verifier ranks were joining")
            dead = children.exited() if children is not None else {}
            if dead and not joined.done():
                raise ConfigError("spawned rank(s) exited before the group formed: " + ", ".join(
                    f"rank {r} status {c}" for r, c in sorted(dead.items())))
        try:
            coll, records = joined.result()
        except Exception as e:  # noqa: BLE001 - torch raises several types on a timeout
            raise TimeoutError(f"verifier ranks did not form a group: {e}") from None
        check_identities(records)
        return coll, records
    except BaseException:
        await asyncio.to_thread(launch.abandon)
        raise


def _settle(fut: asyncio.Future, result, error) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
