"""Typed daemon settings (pp1q.runtime.settings) and where they come from
(pp1q.runtime.config): the structs, the options and TOML keys that map onto them, the
precedence, docs/operations.md's table, and every configuration error as one line
naming the key with exit status 2, through the real ``pp1q`` entry point."""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from pp1q.cli import main
from pp1q.cli import verifier as verifier_cmd
from pp1q.cli import worker as worker_cmd
from pp1q.core.errors import ConfigError, Pp1qError, Reason
from pp1q.runtime.config import MAX_CONFIG_BYTES, load, option_of, resolve
from pp1q.runtime.settings import (
    ROLES,
    VerifierSettings,
    WorkerSettings,
    _num,
    describe,
    fields,
)

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {"worker": worker_cmd, "verifier": verifier_cmd}
CONFIG_ERROR_EXIT = 2


def _parse(role: str, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    COMMANDS[role].add_arguments(p)
    return p.parse_args(argv)


# -- the structs ------------------------------------------------------------------------


def test_config_error_is_a_pp1q_error_with_a_reason():
    e = ConfigError("slots = 0: must be an integer in 1..64", key="slots")
    assert isinstance(e, Pp1qError) and e.reason is Reason.BAD_CONFIG
    assert str(e) == "slots = 0: must be an integer in 1..64" and e.key == "slots"


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_setting_has_one_option_and_nothing_else_does(role):
    """The struct is the list: each field has its option (default None: "not given"),
    and each option but --config and --help is a field."""
    p = argparse.ArgumentParser()
    COMMANDS[role].add_arguments(p)
    dests = {a.dest: a for a in p._actions if a.dest not in ("help", "config")}
    keys = {k for k, _n, _d in fields(ROLES[role])}
    assert set(dests) == keys
    for key, action in dests.items():
        assert action.option_strings == [option_of(key)] or \
            option_of(key) in action.option_strings
        assert action.default is None and action.choices is None, key  # the struct checks


def test_settings_are_checked_whenever_one_is_made():
    s = VerifierSettings(slots=8)
    assert s.slots == 8 and s.depth == 5  # the rest: the defaults
    with pytest.raises(ConfigError, match=r"^slots = 65: must be an integer in 1..64$"):
        VerifierSettings(slots=65)
    with pytest.raises(ConfigError, match="depth = 0"):
        msgspec.structs.replace(s, depth=0)
    with pytest.raises(ConfigError, match="reconnect_max_s = inf"):  # msgspec's Meta lets
        msgspec.convert({"reconnect_max_s": float("inf")}, VerifierSettings)  # inf through
    with pytest.raises(ConfigError, match="max_support = True"):  # a bool is no integer
        WorkerSettings(max_support=True)
    with pytest.raises(AttributeError):  # frozen
        s.slots = 9
    # speculation names the wire versions: sampled only where a daemon says so
    assert WorkerSettings().speculation == VerifierSettings().speculation == "greedy"
    assert WorkerSettings(speculation="sampled").versions == (2, 1)
    assert WorkerSettings().versions == (1,) and WorkerSettings(speculation="off").versions == ()
    assert VerifierSettings(speculation="sampled").versions == (2,)  # never a fallback list
    assert VerifierSettings().versions == (1,)
    assert VerifierSettings(speculation="off").versions == ()


def test_precedence_options_over_role_table_over_top_level_over_defaults(tmp_path):
    cfg = tmp_path / "pp1q.toml"
    cfg.write_text('vocab = 64\nmodel_seed = 3\nlog-level = "debug"\n'
                   '[verifier]\nmodel_seed = 4\nslots = 8\ndepth = 3\nreconnect-max-s = 1\n'
                   '[worker]\nlisten = "127.0.0.1:9001"\n')
    s = resolve(_parse("verifier", ["--config", str(cfg), "--depth", "2"]), "verifier")
    # option > [verifier] > top level > default; an int where a float is due is widened
    assert (s.depth, s.slots, s.model_seed, s.vocab, s.top_k) == (2, 8, 4, 64, 32)
    assert s.reconnect_max_s == 1.0 and isinstance(s.reconnect_max_s, float)
    w = resolve(_parse("worker", ["--config", str(cfg), "--no-check-outgoing"]), "worker")
    assert (w.listen, w.model_seed, w.log_level, w.check_outgoing) == (
        "127.0.0.1:9001", 3, "debug", False)


# -- configuration errors: one line naming the key and the value, status 2 ---------------

BAD_OPTIONS = [  # (role, options, the key named, the value shown)
    ("worker", ["--metrics-port", "99999"], "metrics_port", "99999"),
    ("worker", ["--metrics-port", "-1"], "metrics_port", "-1"),
    ("verifier", ["--metrics-port", "nine"], "metrics_port", "'nine'"),
    ("worker", ["--max-support", "-3"], "max_support", "-3"),
    ("worker", ["--max-support", "0"], "max_support", "0"),
    ("worker", ["--log-level", "bogus"], "log_level", "'bogus'"),
    ("worker", ["--listen", "localhost"], "listen", "'localhost'"),
    ("worker", ["--listen", "127.0.0.1:70000"], "listen", "'127.0.0.1:70000'"),
    ("worker", ["--speculation", "v2"], "speculation", "'v2'"),
    ("worker", ["--draft-preset", "near"], "draft_preset", "'near'"),
    ("worker", ["--draft-distance", "nan"], "draft_distance", "nan"),
    ("worker", ["--vocab", "1"], "vocab", "1"),
    ("worker", ["--model-seed", "-1"], "model_seed", "-1"),
    ("verifier", ["--reconnect-max-s", "nan"], "reconnect_max_s", "nan"),
    ("verifier", ["--reconnect-max-s", "0"], "reconnect_max_s", "0.0"),
    ("verifier", ["--target-delay-ms", "inf"], "target_delay_ms", "inf"),
    ("verifier", ["--target-delay-ms", "-1"], "target_delay_ms", "-1.0"),
    ("verifier", ["--slots", "0"], "slots", "0"),
    ("verifier", ["--slots", "65"], "slots", "65"),
    ("verifier", ["--depth", "17"], "depth", "17"),
    ("verifier", ["--top-k", "257"], "top_k", "257"),
    ("verifier", ["--top-k", "-1"], "top_k", "-1"),
    ("verifier", ["--watchdog-ms", "0"], "watchdog_ms", "0"),
    ("verifier", ["--speculation", "on"], "speculation", "'on'"),
    ("verifier", ["--http", "127.0.0.1"], "http", "'127.0.0.1'"),
    ("verifier", ["--worker", "[::1]:-2"], "worker", "'[::1]:-2'"),
    ("verifier", ["--ranks", "17"], "ranks", "17"),
    ("verifier", ["--rank-timeout-s=-inf"], "rank_timeout_s", "-inf"),
    ("verifier", ["--rank-exit-grace-s", "nan"], "rank_exit_grace_s", "nan"),
    ("verifier", ["--rank-backend", "mpi"], "rank_backend", "'mpi'"),
    ("verifier", ["--shard-kv-budget-bytes", "1000"], "shard_kv_budget_bytes", "1000"),
    ("verifier", ["--shard-kv-budget-bytes", "2e12"], "shard_kv_budget_bytes", "'2e12'"),
    ("verifier", ["--tls-cert", "a.pem"], "tls_key", None),  # all three or none
    ("verifier", ["--breaker-after-timeouts", "0"], "breaker_after_timeouts", "0"),
    ("verifier", ["--breaker-open-s", "nan"], "breaker_open_s", "nan"),
    ("verifier", ["--breaker-open-s", "90"], "breaker_open_max_s", None),  # max below it
    ("verifier", ["--drain-timeout-s", "-1"], "drain_timeout_s", "-1.0"),
    ("verifier", ["--drain-timeout-s", "inf"], "drain_timeout_s", "inf"),
    ("worker", ["--max-connections", "1"], "max_connections", "1"),
    ("worker", ["--hello-timeout-s", "nan"], "hello_timeout_s", "nan"),
    ("worker", ["--idle-timeout-s", "0"], "idle_timeout_s", "0.0"),
    ("worker", ["--max-sessions", "128"], "max_sessions", None),  # below max_connections
    ("worker", ["--max-pending-sessions", "65"], "max_pending_sessions", None),  # <= sessions
]

BAD_FILES = [  # (role, TOML text, the key named, the value shown, the scope named)
    ("verifier", 'log_level = "bogus"\n', "log_level", "'bogus'", "top level"),
    ("verifier", "[verifier]\nmetrics_port = 99999\n", "metrics_port", "99999", "[verifier]"),
    ("worker", "[worker]\nmetrics_port = -1\n", "metrics_port", "-1", "[worker]"),
    ("verifier", "[verifier]\nreconnect_max_s = nan\n", "reconnect_max_s", "nan", "[verifier]"),
    ("verifier", "[verifier]\ntarget_delay_ms = inf\n", "target_delay_ms", "inf", "[verifier]"),
    ("worker", "[worker]\nmax_support = 0\n", "max_support", "0", "[worker]"),
    ("verifier", "[verifier]\nslots = 100\n", "slots", "100", "[verifier]"),
    ("verifier", '[verifier]\nslots = "4"\n', "slots", "'4'", "[verifier]"),
    ("verifier", "[verifier]\ndepth = 5.0\n", "depth", "5.0", "[verifier]"),
    ("verifier", "[verifier]\nshard_kv_budget_bytes = 2199023255553\n",
     "shard_kv_budget_bytes", "2199023255553", "[verifier]"),
    ("worker", "[worker]\ncheck_outgoing = 1\n", "check_outgoing", "1", "[worker]"),
    ("worker", "[worker]\nmax_pending_sessions = 0\n", "max_pending_sessions", "0", "[worker]"),
    ("verifier", "vocab = true\n", "vocab", "True", "top level"),
    # unknown and misplaced keys, for both daemons alike
    ("verifier", "[verifier]\nbogus = 1\n", "bogus", None, "[verifier]"),
    ("worker", "bogus = 1\n", "bogus", None, "top level"),
    ("verifier", 'worker = "10.0.0.1:7070"\n', "worker", "'10.0.0.1:7070'", "top level"),
    ("worker", 'worker = "10.0.0.1:7070"\n', "worker", "'10.0.0.1:7070'", "top level"),
    ("verifier", 'listen = "10.0.0.1:7070"\n', "listen", "'10.0.0.1:7070'", "top level"),
    ("worker", "slots = 4\n", "slots", "4", "top level"),
    ("worker", '[worker]\nhttp = "127.0.0.1:8080"\n', "http", None, "[worker]"),
    ("verifier", "[worker]\nslots = 4\n", "slots", None, "[worker]"),  # the other's table
    ("verifier", "[ranks]\nranks = 2\n", "ranks", None, "top level"),
]


def _refused_in_process(capsys, argv: list[str]) -> str:
    assert main(argv) == CONFIG_ERROR_EXIT
    out, err = capsys.readouterr()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("role, options, key, value", BAD_OPTIONS,
                         ids=[" ".join(c[1]) for c in BAD_OPTIONS])
def test_a_bad_option_is_one_line_naming_it_and_status_2(capsys, role, options, key, value):
    line = _refused_in_process(capsys, [role, *options])
    assert line.startswith(f"pp1q {role}: ") and key in line
    if value is not None:
        assert f"{key} = {value}" in line and option_of(key) in line


@pytest.mark.parametrize("role, text, key, value, scope", BAD_FILES,
                         ids=[f"{c[0]}:{c[1]!r}" for c in BAD_FILES])
def test_a_bad_file_is_one_line_naming_key_file_and_scope(capsys, tmp_path, role, text, key,
                                                          value, scope):
    cfg = tmp_path / "pp1q.toml"
    cfg.write_text(text)
    line = _refused_in_process(capsys, [role, "--config", str(cfg)])
    assert key in line and str(cfg) in line and scope in line
    if value is not None:
        assert f"{key} = {value}" in line


def test_misplaced_keys_say_where_they_belong(capsys, tmp_path):
    cfg = tmp_path / "pp1q.toml"
    cfg.write_text('worker = "10.0.0.1:7070"\n')  # was silently ignored by the verifier
    assert "put it in [verifier]" in _refused_in_process(capsys, ["verifier", "--config",
                                                                   str(cfg)])
    cfg.write_text('[verifier]\nlisten = "10.0.0.1:7070"\n')
    assert "put it in [worker]" in _refused_in_process(capsys, ["worker", "--config",
                                                                 str(cfg)])


def test_unreadable_or_malformed_files_and_usage_errors_are_one_line(capsys, tmp_path):
    assert "cannot read config" in _refused_in_process(
        capsys, ["verifier", "--config", str(tmp_path / "missing.toml")])
    cfg = tmp_path / "pp1q.toml"
    cfg.write_text("vocab = \n")
    assert str(cfg) in _refused_in_process(capsys, ["worker", "--config", str(cfg)])
    cfg.write_bytes(b"\xef\xbb\xbf[verifier]\nslots = 4\n")  # a byte-order mark: read
    assert load(cfg, "verifier") == {"slots": 4}
    cfg.write_bytes(b"slots = 4\n# caf\xe9 in Latin-1\n")  # was: a UnicodeDecodeError traceback
    assert "not UTF-8" in _refused_in_process(capsys, ["verifier", "--config", str(cfg)])
    # the wrong file, read no further than the bound (was: read whole, /dev/zero for ever)
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    assert "larger than" in _refused_in_process(capsys, ["verifier", "--config", str(big)])
    assert "is a character device" in _refused_in_process(
        capsys, ["verifier", "--config", "/dev/zero"])  # a device is refused before a read
    with pytest.raises(SystemExit) as e:  # argparse's own refusals: one line too
        main(["worker", "--no-such-option", "1"])
    assert e.value.code == CONFIG_ERROR_EXIT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--no-such-option" in err


@pytest.mark.daemons
@pytest.mark.parametrize("role, key, args", [
    ("worker", "listen", ["--listen", "127.0.0.1:{port}"]),
    ("worker", "metrics_port", ["--listen", "127.0.0.1:0", "--metrics-port", "{port}"]),
    ("verifier", "http", ["--http", "127.0.0.1:{port}", "--worker", "127.0.0.1:1"]),
])
def test_a_port_in_use_ends_with_one_line_and_status_2(role, key, args):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        argv = [a.format(port=port) for a in args]
        r = subprocess.run([sys.executable, "-m", "pp1q.cli", role, "--vocab", "16", *argv],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == CONFIG_ERROR_EXIT, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr
    assert last.startswith(f"pp1q {role}: {key} = ") and str(port) in last
    assert "in use" in last


# -- docs/operations.md's table ---------------------------------------------------------


def _shown_default(default) -> str:
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return str(default).lower()
    return _num(default) if isinstance(default, float) else str(default)


def _expected_rows() -> dict[str, tuple[str, str, str]]:
    rows: dict[str, tuple[str, str, str]] = {}
    for role, cls in ROLES.items():
        for key, node, default in fields(cls):
            daemon = "both" if key in rows else role
            rows[key] = (daemon, _shown_default(default), describe(node))
    return rows


def test_operations_doc_states_every_key_with_its_default_and_range():
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## Settings", 1)[1].split("\n## ", 1)[0]
    documented = {}
    for line in section.splitlines():
        m = re.match(r"\| `(\w+)` \| ([^|]+) \| ([^|]+) \| ([^|]+) \|", line)
        if m:
            documented[m.group(1)] = tuple(c.strip() for c in m.groups()[1:])
    assert documented == _expected_rows()
