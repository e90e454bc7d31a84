"""Where a daemon's settings come from: command-line options over a TOML file over the
defaults of its settings struct (pp1q.runtime.settings).

A config file holds keys shared by both daemons at the top level and per-daemon keys in
``[worker]`` / ``[verifier]`` tables (the table wins). Keys are the long option names,
with ``-`` or ``_``. An unknown key, a key in the wrong place (a worker-only key at the
top level or in ``[verifier]``), a value of the wrong type or out of range is refused
with one line naming the key, the value, the file and the scope.

    vocab = 129280
    model_seed = 0
    [worker]
    listen = "127.0.0.1:7070"
    [verifier]
    worker = "127.0.0.1:7070"
    http = "127.0.0.1:8080"
    metrics_port = 9102
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from msgspec import inspect as mi

from pp1q.core.errors import ConfigError
from pp1q.runtime.files import read_regular
from pp1q.runtime.settings import (
    ROLES,
    DaemonSettings,
    check_value,
    default_of,
    describe,
    fields,
    from_option,
    kind_of,
    parse_hostport,
)

__all__ = ["ConfigError", "add_config_option", "add_setting", "load", "open_capture",
           "option_of", "parse_hostport", "resolve"]


# a config is a few KiB; a file past this is the wrong one (a log, /dev/zero), refused
# before it is read whole
MAX_CONFIG_BYTES = 1 << 20


def option_of(key: str) -> str:
    return "--" + key.replace("_", "-")


def add_setting(p: argparse.ArgumentParser, role: str, key: str, metavar: str | None = None,
                help: str = "") -> None:  # noqa: A002 - argparse's own word
    """The option of setting ``key``: a string (the settings struct converts and checks
    it), ``default=None`` so "not given" is visible; the help states the struct's default
    and, for a number, its range."""
    cls = ROLES[role]
    node, default = kind_of(cls, key), default_of(cls, key)
    notes = []
    if default is not None:
        notes.append(f"default {str(default).lower() if isinstance(default, bool) else default}")
    if isinstance(node, mi.IntType | mi.FloatType):
        notes.append(describe(node))
    if notes:
        help = f"{help} ({'; '.join(notes)})" if help else "; ".join(notes)
    if isinstance(node, mi.BoolType):
        p.add_argument(option_of(key), dest=key, action=argparse.BooleanOptionalAction,
                       default=None, help=help)
    else:
        p.add_argument(option_of(key), dest=key, metavar=metavar or key.upper(), default=None,
                       help=help)


def add_config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE.toml",
                   help="TOML settings (top level: both daemons; [worker]/[verifier] tables)")


def resolve(args: argparse.Namespace, role: str) -> DaemonSettings:
    """Merge: explicit options > config file ([role] table > top level) > defaults."""
    cls = ROLES[role]
    values: dict[str, object] = {}
    path = getattr(args, "config", None)
    if path:
        values.update(load(Path(path), role))
    for key, _node, _default in fields(cls):
        given = getattr(args, key, None)
        if given is not None:
            values[key] = from_option(cls, key, given, option_of(key))
    return cls(**values)


def load(path: Path, role: str) -> dict[str, object]:
    """The values a config file gives ``role``: top level, then its table over it."""
    try:
        raw, _ = read_regular(path, MAX_CONFIG_BYTES)
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config {path}: larger than {MAX_CONFIG_BYTES} bytes; not a pp1q "
                          f"config")
    try:
        # TOML is UTF-8, whatever the locale; an editor's byte-order mark is dropped
        data = tomllib.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"config {path}: not UTF-8 text (byte {e.start}); TOML is UTF-8"
                          ) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config {path}: {e}") from None
    keys = {r: {k for k, _n, _d in fields(c)} for r, c in ROLES.items()}
    shared = set.intersection(*keys.values())
    tables = {r: data[r] for r in ROLES if isinstance(data.get(r), dict)}
    top = {k: v for k, v in data.items() if k not in tables}
    cls = ROLES[role]
    out: dict[str, object] = {}
    for scope, owner, values in (("top level", None, top),
                                 *((f"[{r}]", r, t) for r, t in tables.items())):
        allowed = shared if owner is None else keys[owner]
        for raw_key, value in values.items():
            key = raw_key.replace("-", "_")
            if key not in allowed:
                raise _misplaced(path, scope, raw_key, key, value, keys, allowed)
            if owner in (None, role):  # another role's table: its daemon checks the values
                out[key] = check_value(cls, key, value, f"config {path}, {scope}")
    return out


def _misplaced(path: Path, scope: str, raw_key: str, key: str, value,
               keys: dict[str, set[str]], allowed: set[str]) -> ConfigError:
    owners = [r for r, ks in keys.items() if key in ks]
    where = f"config {path}, {scope}"
    if isinstance(value, dict):
        return ConfigError(f"[{raw_key}] ({where}): unknown table; known: "
                           f"[{'], ['.join(ROLES)}]", key=key)
    if owners:
        return ConfigError(f"{raw_key} = {value!r} ({where}): a {owners[0]} setting, "
                           f"misplaced: put it in [{owners[0]}]", key=key)
    return ConfigError(f"{raw_key} ({where}): unknown key; known: {', '.join(sorted(allowed))}",
                       key=key)


def open_capture(path: str | None, role: str, info: dict, max_bytes: int | None = None):
    """The ``--capture FILE`` writer of a daemon (pp1q.runtime.capture), None without the
    option, capped at ``max_bytes`` (``--capture-max-bytes``; None: no cap); a file that
    cannot be created is a settings error."""
    if not path:
        return None
    from pp1q.runtime.capture import CaptureWriter

    try:
        return CaptureWriter.open(path, role, info, max_bytes)
    except OSError as e:
        raise ConfigError(f"capture = {path!r}: cannot create capture file: {e.strerror}",
                          key="capture") from None
