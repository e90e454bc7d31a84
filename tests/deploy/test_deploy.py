"""deploy/: systemd units, the two-machine config, Prometheus rules and scrape config,
the Grafana dashboard. The systemd-analyze, promtool-rules, metric-name and PromQL checks
are also shown to catch a planted defect."""

import configparser
import json
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml
from deploy_tools import DEPLOY, exported_names, prometheus_tool

from pp1q.cli import main, verifier, worker
from pp1q.runtime.config import parse_hostport, resolve
from pp1q.verifier.ranks.launch import rank_plan
from pp1q.verifier.scheduler import CUT_GRACE_S

UNITS = DEPLOY / "systemd"
CONFIG = DEPLOY / "config"
PROM = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "pp1q-dashboard.json"
INSTALLED_PP1Q = "/opt/pp1q/venv/bin/pp1q"  # where docs/deploy.md installs the command
RANKS = (0, 1)
CONFIG_ERROR_EXIT = 2  # what the daemons return for a settings error (RestartPreventExitStatus)


# -- systemd units -----------------------------------------------------------------------


def _unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str  # systemd keys are case-sensitive
    cp.read_string((UNITS / name).read_text())
    return cp


@pytest.mark.parametrize("name, role", [("pp1q-worker.service", "worker"),
                                        ("pp1q-verifier@.service", "verifier")])
def test_unit_structure(name, role):
    u = _unit(name)
    assert set(u.sections()) == {"Unit", "Service", "Install"}
    s = u["Service"]
    exec_start = shlex.split(s["ExecStart"])
    assert exec_start[:2] == [INSTALLED_PP1Q, role]
    assert exec_start[2:4] == ["--config", "/etc/pp1q/pp1q.toml"]
    var = f"PP1Q_{role.upper()}_ARGS"
    assert exec_start[4:] == [f"${var}"]  # unquoted: systemd splits it into words
    env_file = s["EnvironmentFile"]
    if role == "verifier":
        assert env_file == "/etc/pp1q/verifier-%i.env"  # required: each rank's own ports
    else:
        assert env_file == "-/etc/pp1q/worker.env"  # optional
    assert s["Restart"] == "on-failure"
    assert s["RestartPreventExitStatus"] == str(CONFIG_ERROR_EXIT)
    assert s["Type"] == "exec" and s["User"] == "pp1q"
    assert "network-online.target" in u["Unit"]["After"]
    assert u["Install"]["WantedBy"] == "multi-user.target"


def test_a_settings_error_exits_with_the_status_units_do_not_restart(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[worker]\nlisten_adress = '127.0.0.1:1'\n")
    assert main(["worker", "--config", str(bad)]) == CONFIG_ERROR_EXIT
    assert main(["verifier", "--config", str(tmp_path / "missing.toml")]) == CONFIG_ERROR_EXIT


def _verify_units(tmp_path, files: dict[str, str]) -> subprocess.CompletedProcess:
    """systemd-analyze verify on copies whose ExecStart points at this pp1q."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (test_unit_structure still ran)")
    here = shutil.which("pp1q") or f"{sys.executable} -m pp1q.cli"
    paths = []
    for name, text in files.items():
        p = tmp_path / name
        p.write_text(text.replace(INSTALLED_PP1Q, here))
        paths.append(str(p))
    return subprocess.run([analyze, "verify", "--man=no", *paths], capture_output=True,
                          text=True, timeout=60)


def _unit_texts():
    texts = {p.name: p.read_text() for p in UNITS.glob("*.service")}
    assert set(texts) == {"pp1q-worker.service", "pp1q-verifier@.service"}
    for rank in RANKS:  # the template, instantiated as each rank
        texts[f"pp1q-verifier@{rank}.service"] = texts["pp1q-verifier@.service"]
    return texts


def test_units_pass_systemd_analyze_verify(tmp_path):
    r = _verify_units(tmp_path, _unit_texts())
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def test_systemd_analyze_check_catches_a_misspelt_key(tmp_path):
    text = (UNITS / "pp1q-worker.service").read_text().replace("Restart=", "Restrat=", 1)
    r = _verify_units(tmp_path, {"pp1q-worker.service": text})
    assert "Restrat" in r.stdout + r.stderr  # our check (no output at all) would fail


# -- the two-machine configuration -------------------------------------------------------


def _env(path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = shlex.split(value)[0] if value.strip() else ""
    return out


def _settings(role: str, extra: list[str]):
    mod = {"worker": worker, "verifier": verifier}[role]
    import argparse
    p = argparse.ArgumentParser()
    mod.add_arguments(p)
    args = p.parse_args(["--config", str(CONFIG / "pp1q.toml"), *extra])
    return resolve(args, role)


def _deployment():
    w = _settings("worker", shlex.split(_env(CONFIG / "worker.env")["PP1Q_WORKER_ARGS"]))
    ranks = {r: _settings("verifier", shlex.split(
        _env(CONFIG / f"verifier-{r}.env")["PP1Q_VERIFIER_ARGS"])) for r in RANKS}
    return w, ranks


def _seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(s|min)?", value.strip())
    assert m, f"TimeoutStopSec {value!r}: use seconds or minutes"
    return float(m.group(1)) * (60 if m.group(2) == "min" else 1)


STOP_MARGIN_S = 5.0  # the verifier closes its link, HTTP and capture after the drain


def test_stop_timeouts_leave_room_for_the_drain():
    """systemd SIGKILLs a unit TimeoutStopSec after SIGTERM: the verifier's must cover
    drain_timeout_s, the round a request cut at the deadline finishes, and a margin."""
    _w, ranks = _deployment()
    drain = max(v.drain_timeout_s for v in ranks.values())
    stop = _seconds(_unit("pp1q-verifier@.service")["Service"]["TimeoutStopSec"])
    assert stop >= drain + CUT_GRACE_S + STOP_MARGIN_S, (stop, drain)
    assert _seconds(_unit("pp1q-worker.service")["Service"]["TimeoutStopSec"]) >= STOP_MARGIN_S


def test_config_is_read_by_both_daemons_and_ranks_are_consistent():
    w, ranks = _deployment()
    w_host, _ = parse_hostport(w.listen)
    for r, v in ranks.items():
        assert v.worker == w.listen, r  # every rank dials the worker
        assert (v.vocab, v.model_seed) == (w.vocab, w.model_seed)  # HELLO identity
        assert v.metrics_port is not None and parse_hostport(v.http)[0] != w_host
    # one rank group: each unit its own --rank, the same size and rendezvous
    assert [rank_plan(v, environ={}).rv.rank for v in ranks.values()] == list(RANKS)
    assert {(v.ranks, v.rank_master) for v in ranks.values()} == {
        (len(RANKS), ranks[0].rank_master)}
    assert len({v.metrics_port for v in ranks.values()}) == len(RANKS)
    assert w.metrics_port is not None
    # sampled speculation enabled explicitly on both ends; rank 0 reads the draw secret
    assert w.speculation == "sampled" and {v.speculation for v in ranks.values()} == {"sampled"}
    assert ranks[0].draw_secret_file is not None


def test_scrape_targets_are_the_configured_metrics_ports():
    w, ranks = _deployment()
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j["static_configs"] for j in cfg["scrape_configs"]}
    assert set(jobs) == {"pp1q-worker", "pp1q-verifier"}
    worker_targets = [t for sc in jobs["pp1q-worker"] for t in sc["targets"]]
    assert worker_targets == [f"{w.metrics_host}:{w.metrics_port}"]
    rank_targets = {sc["labels"]["rank"]: sc["targets"] for sc in jobs["pp1q-verifier"]}
    assert rank_targets == {str(r): [f"{v.metrics_host}:{v.metrics_port}"]
                            for r, v in ranks.items()}


# -- Prometheus rules and scrape config --------------------------------------------------


def _promtool(*args, cwd=PROM) -> subprocess.CompletedProcess:
    return subprocess.run([prometheus_tool("promtool"), *args], capture_output=True,
                          text=True, cwd=cwd, timeout=60)


def test_promtool_check_rules_and_config():
    r = _promtool("check", "rules", "pp1q-rules.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _promtool("check", "config", "prometheus.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_rule_unit_tests_pass():
    r = _promtool("test", "rules", "pp1q-rules.test.yml")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_promtool_rule_tests_catch_a_broken_threshold(tmp_path):
    rules = (PROM / "pp1q-rules.yml").read_text().replace(
        "pp1q:fallback_ratio:rate5m > 0.05", "pp1q:fallback_ratio:rate5m > 0.5")
    (tmp_path / "pp1q-rules.yml").write_text(rules)
    shutil.copy(PROM / "pp1q-rules.test.yml", tmp_path)
    r = _promtool("test", "rules", "pp1q-rules.test.yml", cwd=tmp_path)
    assert r.returncode != 0 and "PP1QHighFallbackRate" in r.stdout + r.stderr


def test_alerts_cover_the_required_conditions():
    groups = yaml.safe_load((PROM / "pp1q-rules.yml").read_text())["groups"]
    alerts = {r["alert"]: r["expr"] for g in groups for r in g["rules"] if "alert" in r}
    assert "up{job=\"pp1q-worker\"}" in alerts["PP1QWorkerDown"]
    assert "fallback_ratio" in alerts["PP1QHighFallbackRate"]
    assert "pp1q_validation_failures_total" in alerts["PP1QValidationFailures"]
    assert "pp1q_watchdog_timeouts_total" in alerts["PP1QWatchdogTimeouts"]
    for g in groups:
        for rule in g["rules"]:
            if "alert" in rule:
                assert rule["labels"]["severity"] in ("warning", "critical")
                assert rule["annotations"]["summary"]


_METRIC = re.compile(r"\bpp1q_[a-z0-9_]+")
_RECORDED = re.compile(r"\bpp1q:[a-z0-9_:]+")


def _recording_rules() -> set[str]:
    groups = yaml.safe_load((PROM / "pp1q-rules.yml").read_text())["groups"]
    return {r["record"] for g in groups for r in g["rules"] if "record" in r}


def _dashboard_exprs() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in d["panels"] for t in p.get("targets", [])]


def _unknown_names(text: str) -> set[str]:
    known = exported_names()
    return ({m for m in _METRIC.findall(text) if m not in known}
            | {m for m in _RECORDED.findall(text) if m not in _recording_rules()})


def _rule_test_series() -> list[str]:
    tests = yaml.safe_load((PROM / "pp1q-rules.test.yml").read_text())["tests"]
    return ([s["series"] for t in tests for s in t.get("input_series", [])]
            + [e["expr"] for t in tests for e in t.get("promql_expr_test", [])])


def test_rules_and_dashboard_use_only_real_metric_names():
    groups = yaml.safe_load((PROM / "pp1q-rules.yml").read_text())["groups"]
    texts = [r["expr"] for g in groups for r in g["rules"]]
    texts += _rule_test_series() + _dashboard_exprs()
    assert not set().union(*map(_unknown_names, texts))
    used = set().union(*(set(_METRIC.findall(t)) for t in texts))
    assert {"pp1q_fallbacks_total", "pp1q_validation_failures_total",
            "pp1q_watchdog_timeouts_total", "pp1q_round_latency_seconds_bucket"} <= used


def test_name_check_catches_a_misspelt_metric():
    assert _unknown_names("rate(pp1q_fallback_total[5m]) + pp1q:nope") == {
        "pp1q_fallback_total", "pp1q:nope"}


# -- Grafana dashboard -------------------------------------------------------------------


def test_dashboard_structure():
    d = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in d["templating"]["list"]} == {"datasource", "instance"}
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0
        if p["type"] != "row":
            assert p["targets"] and p["datasource"]["uid"] == "${datasource}"
            assert all(t["expr"] and t["refId"] for t in p["targets"])


def test_dashboard_queries_are_valid_promql(tmp_path):
    """promtool parses each query as a recording rule (Grafana variables filled in)."""
    fill = {"$instance": ".*", "$__rate_interval": "5m"}
    rules = []
    for i, expr in enumerate(_dashboard_exprs()):
        for var, value in fill.items():
            expr = expr.replace(var, value)
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    (tmp_path / "q.yml").write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": rules}]}))
    r = _promtool("check", "rules", "q.yml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rules[0]["expr"] = "sum(rate(pp1q_rounds_total[5m])"  # a planted syntax error
    (tmp_path / "q.yml").write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": rules}]}))
    assert _promtool("check", "rules", "q.yml", cwd=tmp_path).returncode != 0


def test_docs_name_every_deploy_file():
    doc = (DEPLOY.parent / "docs" / "deploy.md").read_text()
    files = sorted(p.relative_to(DEPLOY.parent).as_posix() for p in DEPLOY.rglob("*")
                   if p.is_file())
    assert files and not [f for f in files if f"`{f}`" not in doc]


def test_missing_prometheus_fails_unless_deliberately_disabled(monkeypatch):
    import deploy_tools
    monkeypatch.setattr(deploy_tools.shutil, "which", lambda name: None)
    monkeypatch.delenv(deploy_tools.NO_PROMETHEUS_ENV, raising=False)
    with pytest.raises(pytest.fail.Exception, match="install Debian's prometheus"):
        deploy_tools.prometheus_tool("promtool")
    monkeypatch.setenv(deploy_tools.NO_PROMETHEUS_ENV, "1")
    with pytest.raises(pytest.skip.Exception, match="deliberately"):
        deploy_tools.prometheus_tool("promtool")
