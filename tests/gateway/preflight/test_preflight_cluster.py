"""Policy and cluster checks against the real chart (real helm) and a recorded Kubernetes API.

A compliant deployment passes; each planted violation fails its own check and no other.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.preflight import CheckResult, Criteria, Inputs, Report, run_preflight
from gateway.preflight.inputs import render_helm
from tests.gateway.preflight.conftest import (
    CHART,
    COMPLIANT_VALUES,
    HELM,
    NAMESPACE,
    SCENARIO_POLICY,
    SCENARIO_VALUES,
    FakeKube,
    SocketRecorder,
    write_kubeconfig,
)

CRITERIA = Criteria(regions=("eu-central-1",), registries=("registry.example.eu",),
                    retention_days=200)
CLUSTER_CHECKS = {"k8s.default-deny", "k8s.node-regions", "k8s.telemetry-env", "k8s.images"}
POLICY_CHECKS = {"policy.destinations", "policy.no-allow-all", "policy.unsafe-off"}


def _values_inputs(*extra: Path, policy: Path = SCENARIO_POLICY) -> Inputs:
    return Inputs(policy=policy, values=(SCENARIO_VALUES, COMPLIANT_VALUES, *extra),
                  chart=CHART, helm=HELM, release="sg", namespace=NAMESPACE)


@pytest.fixture(scope="module")
def rendered() -> str:
    assert HELM.is_file(), "run `make tools` (CI does)"
    return render_helm(_values_inputs(), SCENARIO_POLICY)


def _by_id(report: Report) -> dict[str, CheckResult]:
    return {c.id: c for c in report.checks}


def _failed(report: Report) -> set[str]:
    return {c.id for c in report.checks if c.status == "fail"}


def _manifests(tmp_path: Path, docs: list[dict[str, Any]]) -> Inputs:
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return Inputs(policy=SCENARIO_POLICY, manifests=path, release="sg", namespace=NAMESPACE)


def _docs(rendered: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered) if isinstance(d, dict)]


def test_compliant_chart_render_passes_every_policy_and_cluster_check(rendered: str) -> None:
    report, _ = run_preflight(_values_inputs(), CRITERIA)
    checks = _by_id(report)
    for cid in CLUSTER_CHECKS | POLICY_CHECKS | {"audit.signing-key", "audit.retention"}:
        assert checks[cid].status == "pass", (cid, checks[cid].verdict)
    assert report.exit_code == 0
    peers = checks["k8s.default-deny"].evidence
    assert peers["allowed_peers"] == peers["policy_peers"] == [
        "10.20.0.0/24:8000", "10.30.1.0/28:443"]
    assert checks["gateway.guard"].status == "skip"  # no running gateway given


def test_image_by_tag_fails_only_the_image_check(tmp_path: Path) -> None:
    by_tag = tmp_path / "by-tag.yaml"
    by_tag.write_text("image: {digest: '', tag: '1.4.2'}\n")
    report, _ = run_preflight(_values_inputs(by_tag), CRITERIA)
    assert _failed(report) == {"k8s.images"}
    assert "registry.example.eu/sovereign-gateway/gateway:1.4.2 is not pinned by digest" in (
        _by_id(report)["k8s.images"].verdict)
    assert report.exit_code == 1


def test_image_from_an_unlisted_registry_fails(tmp_path: Path) -> None:
    report, _ = run_preflight(_values_inputs(), Criteria(
        regions=("eu-central-1",), registries=("registry.other.eu",), retention_days=200))
    assert _failed(report) == {"k8s.images"}


def test_missing_default_deny_fails(rendered: str, tmp_path: Path) -> None:
    docs = [d for d in _docs(rendered)
            if not d["metadata"]["name"].endswith("-default-deny")]
    report, _ = run_preflight(_manifests(tmp_path, docs), CRITERIA)
    assert _failed(report) == {"k8s.default-deny"}
    assert "no default-deny egress policy selects sg-sovereign-gateway" in (
        _by_id(report)["k8s.default-deny"].verdict)


def test_egress_peer_outside_the_policy_fails(rendered: str, tmp_path: Path) -> None:
    docs = _docs(rendered)
    egress = next(d for d in docs if d["metadata"]["name"].endswith("-gateway-egress"))
    egress["spec"]["egress"].append(
        {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"port": 443}]})
    report, _ = run_preflight(_manifests(tmp_path, docs), CRITERIA)
    assert _failed(report) == {"k8s.default-deny"}
    assert "peers not in the policy: 203.0.113.0/24:443" in (
        _by_id(report)["k8s.default-deny"].verdict)


def test_non_eu_destination_fails(tmp_path: Path) -> None:
    text = SCENARIO_POLICY.read_text().replace(
        "  - id: model-mirror\n    host: mirror.models.internal.example\n    port: 443\n"
        "    resolves_to: [10.30.1.0/28]\n    region: eu-central-1\n    jurisdiction: EU",
        "  - id: model-mirror\n    host: mirror.models.internal.example\n    port: 443\n"
        "    resolves_to: [10.30.1.0/28]\n    region: us-east-1\n    jurisdiction: US")
    assert "us-east-1" in text
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    report, _ = run_preflight(Inputs(policy=policy), CRITERIA)
    assert _failed(report) == {"policy.destinations"}
    check = _by_id(report)["policy.destinations"]
    # The verdict names what was allowed: a wrong policy and a wrong --region read differently.
    assert check.verdict == ("destination model-mirror is in us-east-1 (US); allowed: regions "
                             "eu-central-1 (--region), jurisdictions EU (--jurisdiction)")
    assert check.evidence["allowed_per_class"]["internal"] == [
        "vllm-external", "vllm-llama-3-1-8b", "vllm-llama-3-3-70b"]


def test_allow_everything_rule_and_unsafe_switch_fail(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(SCENARIO_POLICY.read_text() + "  - {id: open-bar}\n"
                      "unsafe_allow_all: true\n")
    report, _ = run_preflight(Inputs(policy=policy), CRITERIA)
    assert _failed(report) == {"policy.no-allow-all", "policy.unsafe-off"}
    assert _by_id(report)["policy.no-allow-all"].evidence["allow_everything"] == ["open-bar"]


@pytest.fixture
def kube_inputs(fake_kube: FakeKube, tmp_path: Path) -> Iterator[Inputs]:
    cfg = write_kubeconfig(tmp_path / "kubeconfig", fake_kube.url)
    yield Inputs(policy=SCENARIO_POLICY, kubeconfig=cfg, release="sg", namespace=NAMESPACE)


def test_recorded_cluster_passes_and_is_only_read(fake_kube: FakeKube,
                                                  kube_inputs: Inputs) -> None:
    report, facts = run_preflight(kube_inputs, CRITERIA)
    checks = _by_id(report)
    for cid in CLUSTER_CHECKS:
        assert checks[cid].status == "pass", (cid, checks[cid].verdict)
    assert checks["k8s.node-regions"].evidence["source"] == "kubernetes API"
    assert facts.nodes is not None and set(facts.nodes) == {
        "ip-10-0-1-17.eu-central-1.compute.internal", "ip-10-0-2-41.eu-central-1.compute.internal"}
    assert {m for m, _ in fake_kube.requests} == {"GET"}
    assert sorted({p.split("?")[0] for _, p in fake_kube.requests}) == [
        "/api/v1/namespaces/sovereign-ai/pods",
        "/api/v1/nodes/ip-10-0-1-17.eu-central-1.compute.internal",
        "/api/v1/nodes/ip-10-0-2-41.eu-central-1.compute.internal",
        "/apis/networking.k8s.io/v1/namespaces/sovereign-ai/networkpolicies",
    ]


def test_pod_on_a_non_eu_node_fails(fake_kube: FakeKube, kube_inputs: Inputs) -> None:
    node = fake_kube.nodes["ip-10-0-2-41.eu-central-1.compute.internal"]
    node["metadata"]["labels"]["topology.kubernetes.io/region"] = "us-east-1"
    report, _ = run_preflight(kube_inputs, CRITERIA)
    assert _failed(report) == {"k8s.node-regions"}
    verdict = _by_id(report)["k8s.node-regions"].verdict
    assert "sg-sovereign-gateway-vllm-llama-3-3-70b-0 runs on node " \
           "ip-10-0-2-41.eu-central-1.compute.internal in region us-east-1" in verdict
    assert verdict.endswith("; allowed regions: eu-central-1 (from --region)")


def test_vllm_pod_without_telemetry_switches_fails(fake_kube: FakeKube,
                                                   kube_inputs: Inputs) -> None:
    pod = next(p for p in fake_kube.pods["items"]
               if p["metadata"]["labels"]["app.kubernetes.io/component"] == "vllm")
    vllm = pod["spec"]["containers"][0]
    vllm["env"] = [e for e in vllm["env"]
                   if e["name"] not in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK")]
    report, _ = run_preflight(kube_inputs, CRITERIA)
    assert _failed(report) == {"k8s.telemetry-env"}
    assert f"{pod['metadata']['name']}/{vllm['name']}: VLLM_NO_USAGE_STATS, DO_NOT_TRACK not " \
           "set to 1" in _by_id(report)["k8s.telemetry-env"].verdict


def test_otlp_endpoint_or_proxy_outside_the_policy_fails(fake_kube: FakeKube,
                                                         kube_inputs: Inputs) -> None:
    pod = next(p for p in fake_kube.pods["items"]
               if p["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway")
    env = pod["spec"]["containers"][0]["env"]
    env += [{"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "https://otlp.example.com:4318"},
            {"name": "HTTPS_PROXY", "value": "http://user:hunter2@10.20.0.5:8000"}]
    report, _ = run_preflight(kube_inputs, CRITERIA)
    assert _failed(report) == {"k8s.telemetry-env"}
    check = _by_id(report)["k8s.telemetry-env"]
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=https://otlp.example.com:4318 is not a policy " \
           "destination" in check.verdict
    assert "HTTPS_PROXY" not in check.verdict  # 10.20.0.5:8000 lies in vllm-external
    assert "hunter2" not in repr(check.to_json())  # proxy credentials are redacted


def test_no_connection_outside_the_inputs(fake_kube: FakeKube, kube_inputs: Inputs,
                                          sockets: SocketRecorder) -> None:
    inputs = Inputs(**{**{f: getattr(kube_inputs, f) for f in kube_inputs.__dataclass_fields__},
                       "values": (SCENARIO_VALUES, COMPLIANT_VALUES), "chart": CHART,
                       "helm": HELM})
    sockets.active = True
    report, _ = run_preflight(inputs, CRITERIA)
    sockets.active = False
    assert report.exit_code == 0
    kube_port = int(fake_kube.url.rsplit(":", 1)[1])
    assert sockets.connects, "the recorder saw the API connection"
    assert {tuple(a[:2]) for a in sockets.connects} == {("127.0.0.1", kube_port)}
    for host, _ in sockets.lookups:
        assert ipaddress.ip_address(host).is_loopback, host


@pytest.mark.kube
@pytest.mark.skipif("SG_TEST_KUBECONFIG" not in os.environ,
                    reason="opt-in: set SG_TEST_KUBECONFIG (and SG_TEST_RELEASE/NAMESPACE)")
def test_real_api_server_read_only() -> None:
    inputs = Inputs(kubeconfig=Path(os.environ["SG_TEST_KUBECONFIG"]),
                    release=os.environ.get("SG_TEST_RELEASE", "sg"),
                    namespace=os.environ.get("SG_TEST_NAMESPACE", NAMESPACE))
    report, facts = run_preflight(inputs, CRITERIA)
    assert facts.workloads, "the release has pods"
    assert facts.nodes and all(facts.nodes.values())
    ran = {c.id for c in report.checks if c.status != "skip"}
    assert ran >= CLUSTER_CHECKS, ran  # each ran against the live API (pass or fail)


def test_cli_json_report_of_the_compliant_render(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    code = main(["preflight", "--policy", str(SCENARIO_POLICY), "-f", str(SCENARIO_VALUES),
                 "-f", str(COMPLIANT_VALUES), "--chart", str(CHART), "--helm", str(HELM),
                 "-n", NAMESPACE, "--region", "eu-central-1", "--registry",
                 "registry.example.eu", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["result"] == "pass"
    assert report["counts"] == {"pass": 8, "fail": 0, "skip": 7}
    assert {c["id"] for c in report["checks"] if c["status"] == "skip"} == {
        "gateway.guard", "audit.verify", "audit.checkpoint-fresh", "audit.retention",
        "weights.locked-signed", "identity.configured", "mcp.destinations"}
    assert [m["criterion"] for m in report["manual_attestations"]][:2] == ["SOV-1", "SOV-2"]


def test_cli_missing_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    assert main(["preflight", "--kubeconfig", str(tmp_path / "nope")]) == 2
    assert f"--kubeconfig {tmp_path / 'nope'}: no such file" in capsys.readouterr().err


def test_pod_template_pinned_outside_the_regions_fails(rendered: str, tmp_path: Path) -> None:
    docs = _docs(rendered)
    vllm = next(d for d in docs if d["kind"] == "StatefulSet")
    terms = vllm["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    for term in terms:
        for expr in term["matchExpressions"]:
            if expr["key"] == "topology.kubernetes.io/region":
                expr["values"] = ["eu-central-1", "us-east-1"]
    report, _ = run_preflight(_manifests(tmp_path, docs), CRITERIA)
    assert _failed(report) == {"k8s.node-regions"}
    assert (f"StatefulSet {vllm['metadata']['name']} may run in us-east-1; allowed regions: "
            "eu-central-1 (from --region)") == _by_id(report)["k8s.node-regions"].verdict


def test_signing_key_outside_a_secret_and_short_retention_fail(rendered: str,
                                                               tmp_path: Path) -> None:
    docs = _docs(rendered)
    gw = next(d for d in docs if d["kind"] == "Deployment"
              and d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
              == "gateway")
    for vol in gw["spec"]["template"]["spec"]["volumes"]:
        if vol["name"] in ("audit-key", "audit"):
            for k in [k for k in vol if k != "name"]:
                del vol[k]
            vol["emptyDir"] = {}
    report, _ = run_preflight(_manifests(tmp_path, docs), Criteria(
        regions=("eu-central-1",), registries=("registry.example.eu",), retention_days=90))
    assert _failed(report) == {"audit.signing-key", "audit.retention"}
    checks = _by_id(report)
    assert checks["audit.signing-key"].verdict == (
        f"{gw['metadata']['name']}: no Secret volume holds the audit signing key")
    assert checks["audit.retention"].verdict == (
        f"declared retention 90 days < 183 (six months); {gw['metadata']['name']}: audit store "
        "volume is emptyDir, not a PersistentVolumeClaim (lost with the pod)")


def test_private_key_in_values_fails(tmp_path: Path) -> None:
    leaked = tmp_path / "leaked.yaml"
    leaked.write_text("gateway:\n  extraConfig:\n    note: |\n"
                      "      -----BEGIN PRIVATE KEY-----\n      MC4CAQAwBQYDK2VwBCIEIA==\n"
                      "      -----END PRIVATE KEY-----\n")
    report, _ = run_preflight(_values_inputs(leaked), CRITERIA)
    assert "audit.signing-key" in _failed(report)
    assert _by_id(report)["audit.signing-key"].verdict == (
        "the Helm values contain private key material")


@pytest.mark.parametrize(("halves", "version"), [
    (["0.0.0.0/1", "128.0.0.0/1"], 4), (["::/1", "8000::/1"], 6),
    (["::ffff:0.0.0.0/97", "128.0.0.0/1"], 4),  # IPv4-mapped: read as the IPv4 half
])
def test_egress_blocks_that_together_allow_everything_fail(
        rendered: str, tmp_path: Path, halves: list[str], version: int) -> None:
    # Each half passes the one-CIDR /0 check; with no policy given, peers are not compared
    # either: only the union shows that every address is allowed.
    docs = _docs(rendered)
    egress = next(d for d in docs if d["metadata"]["name"].endswith("-gateway-egress"))
    egress["spec"]["egress"].append({"to": [{"ipBlock": {"cidr": c}} for c in halves],
                                     "ports": [{"port": 5432}]})
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    inputs = Inputs(manifests=path, release="sg", namespace=NAMESPACE)
    report, _ = run_preflight(inputs, CRITERIA)
    verdict = _by_id(report)["k8s.default-deny"].verdict
    assert _by_id(report)["k8s.default-deny"].status == "fail"
    assert f"together allow every IPv{version} address, as " \
           f"{'0.0.0.0/0' if version == 4 else '::/0'} would" in verdict, verdict
    assert verdict.startswith("sg-sovereign-gateway"), verdict  # names the pod
