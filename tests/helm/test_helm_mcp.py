"""MCP servers in the chart: each is a policy destination (purpose ``tool``), so the egress
rules the policy CLI renders for the chart allow it like a model replica, and the gateway's
``mcp:`` section reaches config.yaml through ``gateway.extraConfig`` (upstream tokens from the
mounted ``backendCredentials`` Secret, never in values)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import sg_helm as h
import yaml

POLICY_CLI = h.REPO / ".venv" / "bin" / "policy"


def test_mcp_server_destination_is_rendered_into_the_network_policy(tmp_path: Path) -> None:
    doc = yaml.safe_load(h.POLICY_FILE.read_text(encoding="utf-8"))
    doc["destinations"].append({
        "id": "tools-search", "cidr": "192.0.2.64/30", "ports": [8443], "purpose": "tool",
        "region": "eu-west-3", "jurisdiction": "EU", "operator": "acme"})
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(doc), encoding="utf-8")
    proc = subprocess.run(
        [str(h.require_tool(POLICY_CLI)), "networkpolicy", str(policy), "--format",
         "helm-values"], capture_output=True, text=True, timeout=60, check=True)
    values = yaml.safe_load(proc.stdout)
    values["gateway"] = {"extraConfig": {"mcp": {
        "servers": [{"name": "search", "url": "https://192.0.2.65:8443/mcp",
                     "destination": "tools-search",
                     "auth_token_file": "/etc/sovereign-gateway/secrets/search-token"}],
        "access": [{"teams": ["agents"], "allow": ["*"]}]}}}
    out = tmp_path / "values.yaml"
    out.write_text(yaml.safe_dump(values), encoding="utf-8")
    objs = h.render(h.SCENARIOS["default"], out, policy=policy)
    egress = h.one(objs, "NetworkPolicy", "sg-sovereign-gateway-gateway-egress")
    rules = {(peer["ipBlock"]["cidr"], port["port"])
             for rule in egress["spec"]["egress"] for peer in rule["to"] if "ipBlock" in peer
             for port in rule["ports"]}
    assert ("192.0.2.64/30", 8443) in rules
    config = yaml.safe_load(h.one(objs, "ConfigMap", "sg-sovereign-gateway-config")
                            ["data"]["config.yaml"])
    assert config["mcp"]["servers"][0]["destination"] == "tools-search"
