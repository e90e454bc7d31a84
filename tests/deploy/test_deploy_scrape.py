"""A real scrape: Debian's Prometheus server on loopback, deploy/'s scrape config and
rules pointed at a running worker and a verifier rank group of two (rank 0 spawns rank
1; vocabulary-sharded), queried over its HTTP API until every target is up, the pp1q
series of both ranks are ingested and every rule evaluates."""

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml
from daemon_harness import Pair
from deploy_tools import DEPLOY, prometheus_tool

pytestmark = pytest.mark.daemons  # starts real daemon processes or servers

PROM = DEPLOY / "prometheus"
SCRAPE_INTERVAL = "1s"  # deploy/ scrapes every 15s; the test cannot wait that long
DEADLINE_S = 60.0  # bounded wait for each condition; a healthy run needs a few seconds
POLL_S = 0.25


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _until(what: str, check, prom: subprocess.Popen, log) -> object:
    deadline = time.monotonic() + DEADLINE_S
    last = None
    while time.monotonic() < deadline:
        if prom.poll() is not None:
            pytest.fail(f"prometheus exited ({prom.returncode}):\n{log.read_text()[-3000:]}")
        try:
            last = check()
        except OSError as e:  # not listening yet
            last = e
        else:
            if last:
                return last
        time.sleep(POLL_S)
    pytest.fail(f"gave up waiting for {what}; last answer: {last!r}")


def _scrape_config(tmp, worker_port: int, rank_ports: list[int]) -> None:
    """deploy/prometheus.yml with its targets moved to these loopback ports."""
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    cfg["global"]["scrape_interval"] = cfg["global"]["evaluation_interval"] = SCRAPE_INTERVAL
    for job in cfg["scrape_configs"]:
        for sc in job["static_configs"]:
            if job["job_name"] == "pp1q-worker":
                sc["targets"] = [f"127.0.0.1:{worker_port}"]
            else:
                sc["targets"] = [f"127.0.0.1:{rank_ports[int(sc['labels']['rank'])]}"]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    (tmp / "pp1q-rules.yml").write_text((PROM / "pp1q-rules.yml").read_text())


@pytest.fixture
def deployment(tmp_path):
    binary = prometheus_tool("prometheus")
    # worker + a verifier group of two ranks, metrics on free loopback ports
    pair = Pair(tmp_path, verifier_args=["--ranks", "2", "--shard-vocab"])
    prom = None
    try:
        listed = pair.client().health()["ranks"]["metrics"]
        # every rank's /metrics, rank 0's too (it was null: bound after the group formed)
        assert listed[0] == f"127.0.0.1:{pair.verifier.metrics_port}", listed
        rank1 = int(listed[1].rsplit(":", 1)[1])
        _scrape_config(tmp_path, pair.worker.metrics_port, [pair.verifier.metrics_port, rank1])
        port = _free_port()
        log = tmp_path / "prometheus.log"
        with open(log, "w") as f:
            prom = subprocess.Popen(
                [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=f, stderr=subprocess.STDOUT, cwd=tmp_path)
        yield pair, prom, port, log
    finally:
        if prom is not None:
            prom.terminate()
            try:
                prom.wait(15)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait(15)
        pair.close()


def test_prometheus_scrapes_the_deployment(deployment):
    pair, prom, port, log = deployment
    out = pair.client().generate([1, 2, 3], 8, seed=5)  # counters with real values
    assert len(out["token_ids"]) == 8

    def targets_up():
        active = _get(port, "/api/v1/targets")["data"]["activeTargets"]
        health = {(t["labels"]["job"], t["labels"].get("rank")): t["health"] for t in active}
        want = {("pp1q-worker", None), ("pp1q-verifier", "0"), ("pp1q-verifier", "1")}
        return health if set(health) == want and set(health.values()) == {"up"} else None
    _until("all three targets up", targets_up, prom, log)

    def query(q):
        return _get(port, "/api/v1/query", query=q)["data"]["result"]

    def builds():
        roles = sorted(r["metric"]["role"] for r in query("pp1q_build_info"))
        return roles if roles == ["verifier", "verifier", "worker"] else None
    _until("pp1q_build_info from every daemon", builds, prom, log)

    def generated():
        res = query('pp1q_generated_tokens_total{job="pp1q-verifier", rank="0"}')
        return res if res and float(res[0]["value"][1]) >= 8 else None
    _until("rank 0's generated tokens", generated, prom, log)
    assert query('pp1q_steps_total{job="pp1q-worker"}')  # the worker served STEPs

    def group():  # both ranks report the group; rank 0 times its exchanges
        sizes = {r["metric"]["rank"]: r["value"][1] for r in query("pp1q_rank_world_size")}
        timed = query('pp1q_rank_exchange_seconds_count{rank="0"} > 0')
        return sizes if sizes == {"0": "2", "1": "2"} and timed else None
    _until("the rank group's series", group, prom, log)
    up = query("up")
    assert len(up) == 3 and {r["value"][1] for r in up} == {"1"}

    def rules_evaluated():
        groups = _get(port, "/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        done = rules and all(r.get("lastEvaluation", "").startswith("2") and
                             not r["lastEvaluation"].startswith("0001") for r in rules)
        return rules if done else None
    rules = _until("every rule evaluated once", rules_evaluated, prom, log)
    assert {r["health"] for r in rules} == {"ok"}, [r for r in rules if r["health"] != "ok"]
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "pp1q-rules.yml").read_text())["groups"]
    assert len(rules) == sum(len(g["rules"]) for g in shipped)  # every shipped rule loaded
    firing = [a for r in rules for a in r.get("alerts", []) if a["state"] == "firing"]
    assert not firing, firing  # a healthy deployment raises no alert
