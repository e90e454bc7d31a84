"""Security defaults: every daemon binds 127.0.0.1 unless told otherwise (and is then
unreachable from another interface), no deserialiser that runs code, strict msgspec."""

from __future__ import annotations

import asyncio
import importlib
import re
import socket
from pathlib import Path

import pytest

from pp1q.runtime.settings import ROLES, default_of, fields, parse_hostport

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 10.0
LOOPBACK = "127.0.0.1"
SOURCES = [p for d in ("pp1q", "pp1q_kernels", "fuzz", "scripts") if (ROOT / d).is_dir()
           for p in (ROOT / d).rglob("*.py")]


def _address_keys(cls) -> dict[str, str]:
    """Keys whose default is an address (``*_host``, or any HOST:PORT), with its host."""
    out = {}
    for key, kind, default in fields(cls):
        form = (getattr(kind, "extra", None) or {}).get("form")
        if not isinstance(default, str) or form not in (None, "address"):
            continue  # another declared form (early-exit:K looks like HOST:PORT)
        if key.endswith("_host"):
            out[key] = default
        elif re.fullmatch(r"\[?[\w.:-]+\]?:\d+", default):
            out[key] = parse_hostport(default)[0]
    return out


def test_every_daemon_binds_loopback_by_default():
    seen = {}
    for name, cls in ROLES.items():
        for key, host in _address_keys(cls).items():
            seen[f"{name}.{key}"] = host
    # every address a daemon listens on (the rank store too) is found, and all loopback
    assert {"worker.listen", "worker.metrics_host", "verifier.http", "verifier.metrics_host",
            "verifier.rank_master"} <= set(seen)
    assert {k: h for k, h in seen.items() if h != LOOPBACK} == {}


def _outside_address() -> str | None:
    """This machine's address on a non-loopback interface (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 9))
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def _reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def _defaults(role: str):
    cls = ROLES[role]  # nothing given: the defaults
    over = {key: f"{parse_hostport(default_of(cls, key))[0]}:0"  # the default host, any port
            for key in ("listen", "http") if key in cls.__struct_fields__}
    return cls(vocab=16, metrics_port=0, **over)


@pytest.mark.parametrize("role", ["worker", "verifier"])
async def test_default_binds_are_unreachable_from_another_interface(role):
    outside = _outside_address()
    if outside is None:
        pytest.skip("no non-loopback IPv4 interface on this machine")
    serve = importlib.import_module(f"pp1q.{role}.daemon").serve
    stop, ports = asyncio.Event(), []
    task = asyncio.create_task(serve(_defaults(role), stop, ready=lambda *p: ports.extend(p)))
    try:
        while not ports and not task.done():
            await asyncio.sleep(0.01)
        assert len(ports) == 2  # the daemon's port and its metrics port
        for port in ports:
            assert await asyncio.to_thread(_reachable, LOOPBACK, port)
            assert not await asyncio.to_thread(_reachable, outside, port)
    finally:
        stop.set()
        await asyncio.wait_for(task, TIMEOUT_S)


# -- no code-running deserialisers, strict decoding ---------------------------------------

FORBIDDEN = {  # why -> (pattern, a line it must catch)
    "pickle (and its relatives) runs code while loading": (re.compile(
        r"^\s*(import|from)\s+(c?pickle|dill|cloudpickle|shelve|marshal|joblib)\b", re.M),
        "import pickle"),
    "torch.load without weights_only=True unpickles": (re.compile(
        r"torch\.load\((?![^)]*weights_only\s*=\s*True)"), "torch.load(f)"),
    "numpy allow_pickle=True unpickles": (re.compile(r"allow_pickle\s*=\s*True"),
                                          "np.load(f, allow_pickle=True)"),
    "yaml.load / unsafe_load construct objects": (re.compile(r"yaml\.(unsafe_)?load\("),
                                                  "yaml.load(s)"),
    "eval / exec of data": (re.compile(r"(?<![\w.])(eval|exec)\("), "x = eval(s)"),
    "msgspec strict=False coerces types": (re.compile(
        r"(Decoder|decode|convert)\([^)]*strict\s*=\s*False"),
        "msgspec.json.decode(b, strict=False)"),
}
SAFE = "torch.load(f, weights_only=True)\nzip(a, b, strict=False)\nast.literal_eval(s)\n"


@pytest.mark.parametrize("why", sorted(FORBIDDEN))
def test_no_code_running_deserialiser_anywhere(why):
    pattern, planted = FORBIDDEN[why]
    assert pattern.search(planted) and not pattern.search(SAFE)  # the check itself works
    offenders = [str(p.relative_to(ROOT)) for p in SOURCES if pattern.search(p.read_text())]
    assert offenders == [], why
