"""Every values scenario renders a config the real gateway accepts, wired to the pod's ports.

For each scenario the chart is rendered with the real helm, the gateway pod's mounts are
recreated under a temporary root (sg_pod_files) and the real ``gateway check-config`` must exit 0
on the mounted config.yaml. The Deployment's probes and ports must be the gateway's (``/healthz``
and ``/readyz`` on the client port, ``/metrics`` on the admin port; checked against a real
``gateway serve`` of the default scenario), the chart must set no environment variable the
gateway ignores but the telemetry switches its own pre-flight asks for, and the egress rules
must be exactly the destinations ``policy networkpolicy --format helm-values`` prints for the
scenario's policy.
"""

from __future__ import annotations

import functools
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sg_helm as h
import sg_pod_files as pf
import yaml

from tests.conftest import free_port

POLICY_CLI = h.REPO / ".venv" / "bin" / "policy"


def _values(scenario: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(h.SCENARIOS[scenario].read_text(encoding="utf-8"))
    return data


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_gateway_check_config_accepts_the_render(scenario: str, tmp_path: Path) -> None:
    pod = pf.materialize(h.render(h.SCENARIOS[scenario]), tmp_path)
    code, out = pf.check_config(pod.config_file)
    assert code == 0, out
    assert out["ok"] is True
    ports = _ports(pf.gateway_container(pod.objects))
    assert out["listen"] == f"0.0.0.0:{ports['http']}"  # the pod's listener
    assert out["telemetry"]["admin"] == f"0.0.0.0:{ports['admin']}"
    values = _values(scenario)
    telemetry = values.get("telemetry", {})
    expected_otlp = telemetry["endpoint"] if telemetry.get("enabled") else None
    assert out["telemetry"]["otlp_endpoint"] == expected_otlp
    names = [m["name"] for m in values.get("gateway", {}).get("models", [])]
    names += [m["name"] for m in values.get("vllm", {}).get("models", [])]
    assert sorted(out["models"]) == sorted(names)
    assert out["keys"] == ["team-a"]  # from the mounted keys Secret
    assert out["policy"]["file"] == str(tmp_path / "etc/sovereign-gateway/policy.yaml")
    assert out["policy"]["unsafe_allow_all"] is False


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_every_path_in_the_config_is_mounted(scenario: str, tmp_path: Path) -> None:
    """No path in config.yaml points outside the container's mounts (read-only root fs)."""
    pod = pf.materialize(h.render(h.SCENARIOS[scenario]), tmp_path)
    paths = [s.removeprefix("sqlite://") for s in pf.strings(pod.config)
             if s.startswith(("/", "sqlite:///"))]
    assert paths, "the config names files (policy, audit keys)"
    outside = [p for p in paths if not p.startswith(str(tmp_path) + "/")]
    assert outside == [], "config paths outside every volume mount of the gateway container"


def test_chart_refuses_a_collector_outside_the_policy() -> None:
    """Known issue 2 at helm time: postgres-ha with a policy lacking otel-collector."""
    err = h.refuse(h.SCENARIOS["postgres-ha"], policy=h.POLICY_FILE)
    assert ('telemetry.destination "otel-collector" is not a destination of policy.document '
            "(it defines: vllm-external, model-mirror)") in err


@pytest.mark.parametrize(("scenario", "needle"), [
    ("default", 'gateway.models[llama-3.1-8b] replica destination "vllm-external"'),
    ("vllm", 'vllm.models[llama-3-1-8b] (in-chart backend) destination "vllm-llama-3-1-8b"'),
])
def test_chart_refuses_a_config_destination_outside_the_policy(
        scenario: str, needle: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    doc = yaml.safe_load(h.SCENARIO_POLICIES[scenario].read_text(encoding="utf-8"))
    doc["destinations"] = [d for d in doc["destinations"] if d["id"] == "model-mirror"]
    doc["rules"] = []
    policy.write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert needle + " is not a destination of policy.document" in h.refuse(
        h.SCENARIOS[scenario], policy=policy)


def test_chart_refuses_egress_values_not_from_the_policy(tmp_path: Path) -> None:
    extra = tmp_path / "egress.yaml"
    extra.write_text("egress:\n  destinations: [{id: vllm-external, cidrs: [10.20.0.0/24], "
                     "ports: [{port: 8000, protocol: TCP}], fqdn: null}]\n", encoding="utf-8")
    err = h.refuse(h.SCENARIOS["default"], extra)
    assert ("egress.destinations (vllm-external) are not the destinations of policy.document "
            "(model-mirror, vllm-external)") in err


@pytest.mark.parametrize(("override", "needle"), [
    ("cidrs: [10.60.0.0/28]", 'telemetry.cidrs entry 10.60.0.0/28 is not a CIDR of policy '
     'destination "otel-collector" (10.50.0.0/28)'),
    ("port: 4317", 'telemetry.port 4317 is not a port of policy destination "otel-collector"'),
])
def test_chart_refuses_collector_rules_outside_the_policy_destination(
        override: str, needle: str, tmp_path: Path) -> None:
    extra = tmp_path / "telemetry.yaml"
    extra.write_text(f"telemetry:\n  {override}\n", encoding="utf-8")
    assert needle in h.refuse(h.SCENARIOS["postgres-ha"], extra)


def test_check_config_refuses_a_collector_outside_the_policy(tmp_path: Path) -> None:
    """Known issue 2 in the gateway: the mounted policy (e.g. an external ConfigMap drifted)
    lacks the otel-collector destination; the real gateway refuses to start."""
    pod = pf.materialize(h.render(h.SCENARIOS["postgres-ha"]), tmp_path)
    (tmp_path / "etc/sovereign-gateway/policy.yaml").write_text(
        h.POLICY_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    code, out = pf.check_config(pod.config_file)
    assert code == 1
    assert out["ok"] is False
    [problem] = out["problems"]
    assert problem["key"] == "telemetry.otlp_endpoint_destination"
    assert "'otel-collector' is not defined in policy" in problem["problem"]


def test_check_config_refuses_an_unmounted_file(tmp_path: Path) -> None:
    """A config path outside the mounts stays unresolved and the gateway rejects it."""
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump({"gateway": {"models": [{
        "name": "other", "served_model_name": "x/y", "replicas": [{
            "url": "http://10.20.0.12:8000", "destination": "vllm-external",
            "api_key_file": "/etc/sovereign-gateway/not-mounted/key"}]}]}}), encoding="utf-8")
    pod = pf.materialize(h.render(h.SCENARIOS["default"], extra), tmp_path / "pod")
    code, out = pf.check_config(pod.config_file)
    assert code == 1
    assert any("/etc/sovereign-gateway/not-mounted/key" in p["problem"] for p in out["problems"])


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_probes_and_ports_are_the_gateways(scenario: str) -> None:
    objs = h.render(h.SCENARIOS[scenario])
    container = pf.gateway_container(objs)
    config = yaml.safe_load(h.one(objs, "ConfigMap", pf.CONFIG_MAP)["data"]["config.yaml"])
    ports = _ports(container)
    assert ports == {"http": config["listen"]["port"],
                     "admin": config["telemetry"]["admin"]["port"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    svc = h.one(objs, "Service", "sg-sovereign-gateway")
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]} == {
        "http": "http", "admin": "admin"}
    for sm in h.by_kind(objs, "ServiceMonitor"):
        assert [(e["port"], e["path"]) for e in sm["spec"]["endpoints"]] == [("admin", "/metrics")]


#: The gateway container's switches that keep libraries from phoning home (README "Hidden
#: egress"; the Makefile and the Containerfile set the same).
TELEMETRY_ENV = [{"name": "HF_HUB_OFFLINE", "value": "1"},
                 {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
                 {"name": "DO_NOT_TRACK", "value": "1"},
                 {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
                 {"name": "LITELLM_LOCAL_MODEL_COST_MAP", "value": "True"}]


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_gateway_environment_is_the_telemetry_switches_only(scenario: str) -> None:
    """Known issue 1: OTEL_* variables are ignored by the gateway; the chart sets none. The
    telemetry switches are set in the pod spec, where the pre-flight reads them."""
    objs = h.render(h.SCENARIOS[scenario])
    assert pf.gateway_container(objs)["env"] == TELEMETRY_ENV
    for _, _, spec in h.pod_specs(objs):
        for c in spec["containers"]:
            assert not [e for e in c.get("env", []) if e["name"].startswith("OTEL_")], c["name"]


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_every_scenario_passes_its_own_preflight_telemetry_check(scenario: str,
                                                                  tmp_path: Path) -> None:
    """The real ``gateway preflight`` on the render, without any extraEnv: k8s.telemetry-env
    passes for every container (the gateway's and the in-chart vLLM's)."""
    manifests = tmp_path / "rendered.yaml"
    manifests.write_text(h.render_text(h.SCENARIOS[scenario]), encoding="utf-8")
    proc = subprocess.run(
        [str(h.require_tool(pf.GATEWAY_CLI)), "preflight", "--json", "--manifests",
         str(manifests), "-n", h.NAMESPACE, "--release", h.RELEASE,
         "--policy", str(h.policy_for([h.SCENARIOS[scenario]]))],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode in (0, 1), proc.stderr
    (check,) = [c for c in json.loads(proc.stdout)["checks"] if c["id"] == "k8s.telemetry-env"]
    assert check["status"] == "pass", check["verdict"]
    assert "sg-sovereign-gateway/gateway" in check["evidence"]["containers"]


def test_extra_env_follows_the_switches_and_replaces_one_it_names(tmp_path: Path) -> None:
    extra = tmp_path / "env.yaml"
    extra.write_text("gateway:\n  extraEnv: [{name: TZ, value: UTC}]\n", encoding="utf-8")
    objs = h.render(h.SCENARIOS["postgres-ha"], extra)
    assert pf.gateway_container(objs)["env"] == [*TELEMETRY_ENV, {"name": "TZ", "value": "UTC"}]
    extra.write_text("gateway:\n  extraEnv: [{name: DO_NOT_TRACK, value: '0'}]\n",
                     encoding="utf-8")
    env = pf.gateway_container(h.render(h.SCENARIOS["postgres-ha"], extra))["env"]
    assert [e for e in env if e["name"] == "DO_NOT_TRACK"] == [
        {"name": "DO_NOT_TRACK", "value": "0"}]  # one entry per name: the operator's
    assert len(env) == len(TELEMETRY_ENV)


def _wait_up(url: str, proc: subprocess.Popen[str], log: Path) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            text = log.read_text(encoding="utf-8")
            pytest.fail(f"gateway serve exited {proc.returncode}: {text}")
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail(f"gateway did not listen on {url}")


def test_real_gateway_serves_the_probe_paths(tmp_path: Path) -> None:
    """``gateway serve`` on the default render, with the worker count the chart sets from the
    CPU limit: probes on the client port, /metrics on admin."""
    objs = h.render(h.SCENARIOS["default"])
    pod = pf.materialize(objs, tmp_path)
    (container,) = [c for d in h.by_kind(objs, "Deployment")
                    for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "gateway"]
    workers = container["args"][container["args"].index("--workers") + 1]
    assert workers == "2"  # the default CPU limit
    config = dict(pod.config)
    api, admin = free_port(), free_port()
    config["listen"] = {**config["listen"], "host": "127.0.0.1", "port": api}
    config["telemetry"] = {**config["telemetry"], "admin": {"host": "127.0.0.1", "port": admin}}
    # The chart's drain.delay_s (5 s) is for the Service endpoints; none here: stop at once.
    config["drain"] = {**config["drain"], "delay_s": 0}
    pod.config_file.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    log = (tmp_path / "serve.log").open("w", encoding="utf-8")
    proc = subprocess.Popen([str(pf.GATEWAY_CLI), "serve", "--config", str(pod.config_file),
                             "--workers", workers],
                            stdout=subprocess.DEVNULL, stderr=log, text=True, env=env)
    try:
        _wait_up(f"http://127.0.0.1:{api}/healthz", proc, tmp_path / "serve.log")
        _wait_up(f"http://127.0.0.1:{admin}/metrics", proc, tmp_path / "serve.log")
        assert httpx.get(f"http://127.0.0.1:{api}/healthz").status_code == 200
        ready = httpx.get(f"http://127.0.0.1:{api}/readyz")
        assert ready.status_code in (200, 503), ready.text  # the route exists; backends may not
        deadline = time.monotonic() + 60
        while True:  # the pod's /metrics: both workers once the second one serves too
            try:
                metrics = httpx.get(f"http://127.0.0.1:{admin}/metrics")
            except httpx.TransportError as exc:  # the pod stopped: its log says why
                pytest.fail(f"{exc!r}; gateway serve exit status {proc.poll()}; log:\n"
                            + (tmp_path / "serve.log").read_text(encoding="utf-8")[-4000:])
            assert metrics.status_code == 200
            if "sg_gateway_workers 2.0" in metrics.text or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert "# TYPE" in metrics.text
        assert "sg_gateway_workers 2.0" in metrics.text
        assert httpx.get(f"http://127.0.0.1:{api}/metrics").status_code == 404
        models = httpx.get(f"http://127.0.0.1:{api}/v1/models",
                           headers={"Authorization": f"Bearer {pf.API_KEY}"})
        assert models.status_code == 200, models.text  # the keys Secret stand-in is live
        assert [m["id"] for m in models.json()["data"]][:1] == ["llama-3.1-8b"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    # The audit store the chart points at (the PVC mount) is where the gateway wrote.
    assert (tmp_path / "var/lib/sovereign-gateway/audit/audit.db").is_file()


@functools.cache
def _helm_values(policy: Path) -> list[dict[str, Any]]:
    """What ``policy networkpolicy --format helm-values`` prints for ``policy`` (run once per
    file; callers must not change the list)."""
    proc = subprocess.run(
        [str(h.require_tool(POLICY_CLI)), "networkpolicy", str(policy), "--format",
         "helm-values"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    dests: list[dict[str, Any]] = yaml.safe_load(proc.stdout)["egress"]["destinations"]
    return dests


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_scenario_egress_values_are_the_policy_cli_output(scenario: str) -> None:
    expected = _helm_values(h.SCENARIO_POLICIES[scenario])
    assert _values(scenario)["egress"]["destinations"] == expected


def _rendered_destinations(objs: list[dict[str, Any]]) -> set[tuple[str, int, str]]:
    """(cidr or fqdn, port, protocol) of the gateway's egress rules, DNS and pod peers excluded."""
    out: set[tuple[str, int, str]] = set()
    for np in h.by_kind(objs, "NetworkPolicy"):
        if np["metadata"]["name"] != "sg-sovereign-gateway-gateway-egress":
            continue
        for rule in np["spec"]["egress"]:
            for peer in rule["to"]:
                if "ipBlock" in peer:
                    out |= {(peer["ipBlock"]["cidr"], p["port"], p["protocol"])
                            for p in rule["ports"]}
    for cnp in h.by_kind(objs, "CiliumNetworkPolicy"):
        for rule in cnp["spec"]["egress"]:
            ports = [(int(p["port"]), p["protocol"]) for tp in rule.get("toPorts", [])
                     for p in tp["ports"]]
            names = rule.get("toCIDR", []) + [f["matchName"] for f in rule.get("toFQDNs", [])]
            out |= {(n, port, proto) for n in names for port, proto in ports}
    return out


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_network_policy_allows_exactly_the_policy_destinations(scenario: str) -> None:
    objs = h.render(h.SCENARIOS[scenario])
    values = _values(scenario)
    cilium = values.get("networkPolicy", {}).get("flavor") == "cilium"
    vllm_ids = {f"vllm-{m['name']}" for m in values.get("vllm", {}).get("models", [])}
    expected: set[tuple[str, int, str]] = set()
    for d in _helm_values(h.SCENARIO_POLICIES[scenario]):
        if d["id"] in vllm_ids:
            # In-chart vLLM Services: hostname-only policy destinations, allowed by pod selector.
            assert d["fqdn"] == f"sg-sovereign-gateway-{d['id']}" and not d["cidrs"]
            continue
        names = list(d["cidrs"]) + ([d["fqdn"]] if cilium and d["fqdn"] else [])
        expected |= {(n, p["port"], p["protocol"]) for n in names for p in d["ports"]}
    store = values["audit"].get("store", {})
    if store.get("type") == "postgresql":  # the audit database is not a policy destination
        pg = store["postgresql"]
        expected |= {(c, pg["port"], "TCP") for c in pg["cidrs"]}
    assert _rendered_destinations(objs) == expected
    if vllm_ids:
        egress = h.one(objs, "NetworkPolicy", "sg-sovereign-gateway-gateway-egress")
        pod_rules = [r for r in egress["spec"]["egress"]
                     if any("podSelector" in p and "namespaceSelector" not in p
                            for p in r["to"])]
        assert [r["ports"] for r in pod_rules] == [[{"port": 8000, "protocol": "TCP"}]]
