"""Daemon settings: command-line options over a TOML file over built-in defaults.

A config file holds keys shared by both daemons at the top level and per-daemon keys in
``[worker]`` / ``[verifier]`` tables (the table wins). Keys are the long option names,
with ``-`` or ``_``; an unknown key or a value of the wrong type is refused, naming it.

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

ROLES = ("worker", "verifier")


class ConfigError(Exception):
    """A settings problem the user must fix (message names the key and the file)."""


def parse_hostport(text: str, what: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port)."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} {text!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def hostport(text: str) -> str:
    """argparse ``type=``: validate HOST:PORT, keep the text."""
    try:
        parse_hostport(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def open_capture(settings: dict, role: str, info: dict):
    """The ``--capture FILE`` writer of a daemon (pp1q.runtime.capture), None without the option;
    a file that cannot be created is a settings error."""
    path = settings.get("capture")
    if not path:
        return None
    from pp1q.runtime.capture import CaptureWriter

    try:
        return CaptureWriter.open(path, role, info)
    except OSError as e:
        raise ConfigError(f"cannot create capture {path}: {e.strerror}") from None


def add_config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE.toml",
                   help="TOML settings (top level: both daemons; [worker]/[verifier] tables)")


Settings = dict[str, tuple[type, object]]  # key -> (type, default); default None: unset


def resolve(args: argparse.Namespace, role: str, settings: Settings) -> dict:
    """Merge: explicit options > config file ([role] table > top level) > defaults.

    Options must be declared with ``default=None`` so "not given" is visible.
    """
    file_values: dict[str, object] = {}
    path = getattr(args, "config", None)
    if path:
        file_values = _load(Path(path), role, settings)
    out = {}
    for key, (_kind, default) in settings.items():
        given = getattr(args, key, None)
        out[key] = given if given is not None else file_values.get(key, default)
    return out


def _load(path: Path, role: str, settings: Settings) -> dict[str, object]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config {path}: {e}") from None
    merged: dict[str, object] = {}
    shared = {k: v for k, v in data.items() if k not in ROLES}
    table = data.get(role, {})
    if not isinstance(table, dict):
        raise ConfigError(f"config {path}: [{role}] must be a table")
    for scope, values in (("top level", shared), (f"[{role}]", table)):
        for raw_key, value in values.items():
            key = raw_key.replace("-", "_")
            if key not in settings:
                if scope == "top level" and _known_elsewhere(key):
                    continue  # a key for the other daemon, shared file
                raise ConfigError(f"config {path}: unknown key {raw_key!r} in {scope}; "
                                  f"known: {', '.join(sorted(settings))}")
            merged[key] = _typed(path, raw_key, value, settings[key][0])
    return merged


def _known_elsewhere(key: str) -> bool:
    from pp1q.cli import verifier, worker  # the other role's keys are legal at top level

    return key in worker.SETTINGS or key in verifier.SETTINGS


def _typed(path: Path, key: str, value: object, want: type) -> object:
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) != (want is bool) or not isinstance(value, want):
        raise ConfigError(f"config {path}: {key} must be {want.__name__}, "
                          f"got {type(value).__name__}")
    return value
