"""A real Prometheus scrapes a real ``gateway serve`` and runs the Grafana dashboard's queries.

``gateway serve`` (process guard enforcing, SQLite audit, admin port) relays to three vLLM
simulators; the official openai SDK sends two rounds of traffic (plain, streamed, one retried
after a 429, one refused by the egress policy) with a scrape in between, so every rate has two
samples. Then:

* ``promtool check metrics`` accepts ``/metrics`` (format and naming lint);
* every PromQL expression of ``dashboards/sovereign-gateway.json`` (the Helm chart ships the same
  bytes, see ``test_gw_telemetry``) runs through Prometheus's query API without error and, except
  for those listed in ``MAY_BE_EMPTY`` with the reason, returns series without NaN;
* the checker fails on a broken expression and on a wrong metric name.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.audit import Signer, generate_key_file, write_key_pair
from tests.conftest import free_port
from tests.gateway.egress_testdata import KEYS, gateway_config, policy_text
from tests.gateway.telemetry.prometheus_server import (
    PrometheusServer,
    check_dashboard,
    dashboard_queries,
    prometheus_binary,
)
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

ROOT = Path(__file__).parents[3]
DASHBOARDS = [ROOT / "dashboards/sovereign-gateway.json",
              ROOT / "helm/sovereign-gateway/dashboards/sovereign-gateway.json"]
CHAT = [{"role": "user", "content": "hi"}]

# Queries that legitimately return no series after this traffic, with the reason.
MAY_BE_EMPTY = {
    "panel:20:B": "sg_audit_append_failures_total gets its first series at the first failed "
                  "audit append; the SQLite store of this run never fails",
}
ROUND = 5  # requests per round: 2 plain, 1 streamed, 1 retried, 1 denied


@dataclass
class Running:
    url: str
    admin: str
    prom: PrometheusServer
    sims: dict[str, str]


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"gateway did not start: {log.read_text()[-3000:]}")
        time.sleep(0.1)


def _round(stack: Running) -> None:
    """One round of traffic through the official openai SDK."""
    pub = openai.OpenAI(base_url=stack.url + "/v1", api_key=KEYS["pub"], max_retries=0,
                        timeout=20)
    for _ in range(2):
        assert pub.chat.completions.create(model="m", messages=CHAT, max_tokens=4).usage
    chunks = list(pub.chat.completions.create(
        model="m", messages=CHAT, max_tokens=8, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 1
    # confidential goes only to eu-a: one 429 there, waited out (Retry-After: 0) and retried
    httpx.post(stack.sims["eu-a"] + "/sim/faults", timeout=5,
               json={"mode": "status_429", "retry_after_s": 0, "count": 1}).raise_for_status()
    conf = openai.OpenAI(base_url=stack.url + "/v1", api_key=KEYS["conf"], max_retries=0,
                         timeout=20)
    assert conf.chat.completions.create(model="m", messages=CHAT, max_tokens=4).usage
    contractor = openai.OpenAI(base_url=stack.url + "/v1", api_key=KEYS["contractor"],
                               max_retries=0, timeout=20)
    with pytest.raises(openai.PermissionDeniedError):
        contractor.chat.completions.create(model="m", messages=CHAT, max_tokens=4)
    for c in (pub, conf, contractor):
        c.close()


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """Gateway + simulators + Prometheus after two scraped rounds of traffic."""
    from tests.conftest import ServerThread

    prometheus_binary("promtool")
    tmp = tmp_path_factory.mktemp("prom")
    sims = {n: ServerThread(create_sim(SimConfig(models=["m"]))).start()
            for n in ("eu-a", "eu-b", "us")}
    pfile = tmp / "policy.yaml"
    pfile.write_text(policy_text({n: s.port for n, s in sims.items()}))
    port, admin_port = free_port(), free_port()
    cfg = gateway_config({n: s.url for n, s in sims.items()}, pfile, guard="enforce", port=port)
    cfg["retries"] = {"max_attempts": 3}
    key, _ = write_key_pair(Signer.generate(), tmp / "audit.key")
    cfg["audit"] = {"store": f"sqlite://{tmp / 'audit.db'}", "signing_key_file": str(key),
                    "pseudonym_key_file": str(generate_key_file(tmp / "pseudonym.key"))}
    cfg["telemetry"] = {"admin": {"host": "127.0.0.1", "port": admin_port}}
    (tmp / "gateway.yaml").write_text(yaml.safe_dump(cfg))
    log = tmp / "gateway.log"
    prom = PrometheusServer(tmp / "prometheus", [f"127.0.0.1:{admin_port}"])
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(tmp / "gateway.yaml")],
            cwd=ROOT, env=dict(os.environ), stdout=err, stderr=err, stdin=subprocess.DEVNULL)
    try:
        stack = Running(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", prom,
                        {n: s.url for n, s in sims.items()})
        _wait_http(stack.url + "/healthz", proc, log)
        _wait_http(stack.admin + "/healthz", proc, log)
        prom.start()
        prom.wait_for('up{job="sovereign-gateway"}', lambda v: v == 1)
        appends = "sum(sg_audit_append_duration_seconds_count)"
        _round(stack)
        prom.wait_for("sum(sg_gateway_requests_total)", lambda v: v >= ROUND)
        first = prom.wait_for(appends, lambda v: v > 0)
        _round(stack)
        prom.wait_for("sum(sg_gateway_requests_total)", lambda v: v >= 2 * ROUND)
        prom.wait_for(appends, lambda v: v > first)
        yield stack
    finally:
        prom.stop()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        for s in sims.values():
            s.stop()


def test_promtool_accepts_the_metrics_endpoint(scraped: Running) -> None:
    text = httpx.get(scraped.admin + "/metrics", timeout=5).text
    assert "sg_gateway_requests_total{" in text
    res = subprocess.run([prometheus_binary("promtool"), "check", "metrics"], input=text,
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0 and res.stdout + res.stderr == "", res.stdout + res.stderr


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dashboard_query_runs_and_traffic_fills_its_panels(
    scraped: Running, path: Path
) -> None:
    dashboard = json.loads(path.read_text())
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 20  # the panels and the two variables are all found
    assert set(MAY_BE_EMPTY) <= {q.key for q in queries}  # no stale exemption
    assert check_dashboard(scraped.prom, dashboard, MAY_BE_EMPTY) == []


def _plant(expr: str) -> dict[str, Any]:
    dashboard = json.loads(DASHBOARDS[0].read_text())
    bad = copy.deepcopy(dashboard)
    panel = next(p for p in bad["panels"] if p.get("targets"))
    panel["targets"] = [{"refId": "Z", "expr": expr}]  # in place of that panel's own queries
    return bad


@pytest.mark.parametrize(("expr", "problem"), [
    # a syntax error: Prometheus answers bad_data
    ('sum(rate(sg_gateway_requests_total{sg_key_id=~"$key"}[$__rate_interval])',
     "bad_data"),
    # a metric name the gateway does not export: runs, but the panel would stay empty
    ('sum(rate(sg_gateway_request_total{sg_key_id=~"$key"}[$__rate_interval]))', "no series"),
    # a label the series do not have: the quantile has no buckets to work on
    ('histogram_quantile(0.9, sum by (le) (rate(gen_ai_server_time_to_first_token_seconds_'
     'bucket{gen_ai_model=~".+"}[$__rate_interval])))', "no series"),
])
def test_a_wrong_dashboard_query_fails_the_check(
    scraped: Running, expr: str, problem: str
) -> None:
    problems = check_dashboard(scraped.prom, _plant(expr), MAY_BE_EMPTY)
    assert len(problems) == 1, problems
    assert "Z: " in problems[0] and problem in problems[0]


def test_a_variable_over_a_missing_label_fails_the_check(scraped: Running) -> None:
    dashboard = json.loads(DASHBOARDS[0].read_text())
    dashboard["templating"]["list"][1]["query"]["query"] = (
        "label_values(sg_gateway_requests_total, gen_ai_model)")
    problems = check_dashboard(scraped.prom, dashboard, MAY_BE_EMPTY)
    assert problems == ["variable $model: no series of sg_gateway_requests_total with label "
                        "gen_ai_model"]
