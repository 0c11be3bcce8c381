"""One source of truth: the chart's egress rules come from the policy file the gateway enforces.

The real policy CLI renders ``egress.destinations`` from the policy file
(``policy networkpolicy POLICY --format helm-values``); helm renders the chart with that output
and the same file as ``policy.document``. The NetworkPolicy must then allow exactly the
policy's destinations, and the ConfigMap must carry exactly that policy file.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import sg_helm as h
import yaml

POLICY_CLI = h.REPO / ".venv" / "bin" / "policy"
EXAMPLE = h.REPO / "examples" / "policy.yaml"


def _policy_values(policy: Path, out: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [str(h.require_tool(POLICY_CLI)), "networkpolicy", str(policy), "--format",
         "helm-values"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out.write_text(proc.stdout, encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(proc.stdout)
    return data


def _ipblock_rules(objs: list[dict[str, Any]]) -> set[tuple[str, int, str]]:
    egress = h.one(objs, "NetworkPolicy", "sg-sovereign-gateway-gateway-egress")
    return {(peer["ipBlock"]["cidr"], port["port"], port["protocol"])
            for rule in egress["spec"]["egress"] for peer in rule["to"] if "ipBlock" in peer
            for port in rule["ports"]}


def _expected(values: dict[str, Any]) -> set[tuple[str, int, str]]:
    return {(cidr, port["port"], port["protocol"])
            for d in values["egress"]["destinations"] for cidr in d["cidrs"] for port in d["ports"]}


def _check_policy_file(policy: Path, tmp_path: Path) -> None:
    out = tmp_path / "egress-values.yaml"
    values = _policy_values(policy, out)
    if policy.resolve() != h.POLICY_FILE.resolve():
        # The scenario's model names destination vllm-external of the test policy (the chart
        # refuses a replica destination the policy lacks); bind it to none for another policy.
        models = tmp_path / "models.yaml"
        models.write_text("gateway:\n  models: [{name: m, served_model_name: x/m, replicas: "
                          "[{url: 'http://192.0.2.1:8000'}]}]\n", encoding="utf-8")
        out.write_text(out.read_text(encoding="utf-8") + models.read_text(encoding="utf-8"),
                       encoding="utf-8")
    assert values["egress"]["destinations"], "the policy names no destination"
    ids = [d["id"] for d in values["egress"]["destinations"]]
    assert ids == sorted(ids)
    cidr_dests = [d for d in values["egress"]["destinations"] if d["cidrs"]]
    if len(cidr_dests) != len(values["egress"]["destinations"]):
        # Hostname-only destinations: the Kubernetes flavor refuses, the Cilium one renders.
        err = h.refuse(h.SCENARIOS["default"], out, policy=policy)
        assert "has only a hostname" in err
        objs = h.render(h.SCENARIOS["cilium"], out, policy=policy)
        (cnp,) = h.by_kind(objs, "CiliumNetworkPolicy")
        fqdns = {r["toFQDNs"][0]["matchName"] for r in cnp["spec"]["egress"] if "toFQDNs" in r}
        assert fqdns == {d["fqdn"] for d in values["egress"]["destinations"] if d["fqdn"]}
        return
    objs = h.render(h.SCENARIOS["default"], out, policy=policy)
    assert _ipblock_rules(objs) == _expected(values)
    config = h.one(objs, "ConfigMap", "sg-sovereign-gateway-config")
    assert config["data"]["policy.yaml"].rstrip("\n") == policy.read_text(
        encoding="utf-8").rstrip("\n")


def test_chart_egress_equals_policy_destinations(tmp_path: Path) -> None:
    _check_policy_file(h.POLICY_FILE, tmp_path)


def test_example_policy_renders_through_the_chart(tmp_path: Path) -> None:
    if not EXAMPLE.is_file():
        pytest.skip("examples/policy.yaml not shipped yet (owned by the policy package)")
    _check_policy_file(EXAMPLE, tmp_path)


def test_test_values_are_what_the_policy_cli_prints(tmp_path: Path) -> None:
    """The scenario values carry the CLI's output, not hand-made rules."""
    values = _policy_values(h.POLICY_FILE, tmp_path / "egress-values.yaml")
    scenario = yaml.safe_load(h.SCENARIOS["default"].read_text(encoding="utf-8"))
    assert scenario["egress"]["destinations"] == values["egress"]["destinations"]


def test_changed_policy_changes_the_network_rules(tmp_path: Path) -> None:
    """Adding a destination to the policy adds exactly its rule, nothing else."""
    doc = yaml.safe_load(h.POLICY_FILE.read_text(encoding="utf-8"))
    doc["destinations"].append({
        "id": "eu-llm-api", "cidr": "192.0.2.0/28", "ports": [443, 8443],
        "region": "eu-west-3", "jurisdiction": "EU", "operator": "provider"})
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(doc), encoding="utf-8")
    out = tmp_path / "egress-values.yaml"
    values = _policy_values(policy, out)
    objs = h.render(h.SCENARIOS["default"], out, policy=policy)
    rules = _ipblock_rules(objs)
    assert rules == _expected(values)
    assert {("192.0.2.0/28", 443, "TCP"), ("192.0.2.0/28", 8443, "TCP")} <= rules


def test_hostname_only_destination_needs_cilium(tmp_path: Path) -> None:
    doc = yaml.safe_load(h.POLICY_FILE.read_text(encoding="utf-8"))
    doc["destinations"].append({
        "id": "mistral-eu", "host": "api.mistral.example.eu", "port": 443,
        "region": "eu-west-3", "jurisdiction": "EU", "operator": "provider"})
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(doc), encoding="utf-8")
    _check_policy_file(policy, tmp_path)
