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


def _policy_with_tool_server(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """The chart's policy plus the ``tools-search`` destination (purpose ``tool``), and the
    chart values the policy CLI renders from it (``egress.destinations``)."""
    doc = yaml.safe_load(h.POLICY_FILE.read_text(encoding="utf-8"))
    doc["destinations"].append({
        "id": "tools-search", "cidr": "192.0.2.64/30", "ports": [8443], "purpose": "tool",
        "region": "eu-west-3", "jurisdiction": "EU", "operator": "acme"})
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(doc), encoding="utf-8")
    proc = subprocess.run(
        [str(h.require_tool(POLICY_CLI)), "networkpolicy", str(policy), "--format",
         "helm-values"], capture_output=True, text=True, timeout=60, check=True)
    values: dict[str, object] = yaml.safe_load(proc.stdout)
    return policy, values


def test_mcp_server_destination_is_rendered_into_the_network_policy(tmp_path: Path) -> None:
    policy, values = _policy_with_tool_server(tmp_path)
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


# -- the first-class mcp: values --------------------------------------------------------------

SERVER = {"name": "search", "url": "https://192.0.2.65:8443/mcp", "destination": "tools-search",
          "region": "eu-west-3", "jurisdiction": "EU",
          "credentials": {"existingSecret": "sg-mcp-search", "secretKey": "api-token"},
          "tools": {"fetch": {"url_arguments": ["url"], "max_argument_bytes": 4096}},
          "flow": {"max_concurrent": 8, "max_queued": 16, "queue_timeout_s": 2}}


def _mcp_values(tmp_path: Path, servers: list[dict[str, object]],
                extra: dict[str, object] | None = None) -> tuple[Path, Path]:
    """A policy with the tools-search destination (and egress.destinations rendered from it
    by the policy CLI) and values declaring ``servers`` under ``mcp:``."""
    policy, values = _policy_with_tool_server(tmp_path)
    values["mcp"] = {"servers": servers,
                     "access": [{"teams": ["agents"], "servers": ["search"], "allow": ["*"]}],
                     "limits": {"call_timeout_s": 30}}
    values.update(extra or {})
    out = tmp_path / "values.yaml"
    out.write_text(yaml.safe_dump(values), encoding="utf-8")
    return out, policy


def test_mcp_values_render_config_secret_mount_and_egress_rule(tmp_path: Path) -> None:
    from gateway.mcp.settings import McpSettings

    values, policy = _mcp_values(tmp_path, [SERVER])
    objs = h.render(h.SCENARIOS["default"], values, policy=policy)
    config = yaml.safe_load(h.one(objs, "ConfigMap", "sg-sovereign-gateway-config")
                            ["data"]["config.yaml"])
    assert config["mcp"] == {
        "servers": [{"name": "search", "url": "https://192.0.2.65:8443/mcp",
                     "destination": "tools-search",
                     "auth_token_file": "/etc/sovereign-gateway/mcp/search/token",
                     "tools": {"fetch": {"url_arguments": ["url"], "max_argument_bytes": 4096}},
                     "flow": {"max_concurrent": 8, "max_queued": 16, "queue_timeout_s": 2}}],
        "access": [{"teams": ["agents"], "servers": ["search"], "allow": ["*"]}],
        "allowed_origins": [], "limits": {"call_timeout_s": 30}}
    McpSettings.model_validate(config["mcp"])  # the gateway's own model accepts it

    pod = h.one(objs, "Deployment", "sg-sovereign-gateway")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "mcp-credentials-0"]
    assert volume["secret"] == {"secretName": "sg-mcp-search", "defaultMode": 0o400,
                                "items": [{"key": "api-token", "path": "token"}]}
    [container] = [c for c in pod["containers"] if c["name"] == "gateway"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "mcp-credentials-0"]
    assert (mount["mountPath"], mount["readOnly"]) == ("/etc/sovereign-gateway/mcp/search", True)
    assert "sg-mcp-search" not in yaml.safe_dump(config)  # a Secret name, never its value

    egress = h.one(objs, "NetworkPolicy", "sg-sovereign-gateway-gateway-egress")
    rules = {(peer["ipBlock"]["cidr"], port["port"])
             for rule in egress["spec"]["egress"] for peer in rule["to"] if "ipBlock" in peer
             for port in rule["ports"]}
    assert ("192.0.2.64/30", 8443) in rules
    assert not any(cidr in ("0.0.0.0/0", "::/0") for cidr, _ in rules)


def test_mcp_values_that_the_policy_does_not_grant_are_refused(tmp_path: Path) -> None:
    cases = [
        ({**SERVER, "destination": "vllm-external"}, 'has purpose "inference"'),
        ({**SERVER, "destination": "nowhere"}, '"nowhere" is not a destination of policy'),
        ({**SERVER, "region": "us-east-1"}, 'region "us-east-1" is not the region'),
        ({**SERVER, "jurisdiction": "US"}, 'jurisdiction "US" is not the jurisdiction'),
        ({k: v for k, v in SERVER.items() if k != "destination"}, "destination"),
        ({**SERVER, "credentials": {"secretKey": "x"}}, "existingSecret"),
    ]
    for i, (server, message) in enumerate(cases):
        work = tmp_path / str(i)
        work.mkdir()
        values, policy = _mcp_values(work, [server])
        assert message in h.refuse(h.SCENARIOS["default"], values, policy=policy), server
    values, policy = _mcp_values(tmp_path, [SERVER], {"gateway": {"extraConfig": {"mcp": {}}}})
    assert "declare MCP servers in one place" in h.refuse(
        h.SCENARIOS["default"], values, policy=policy)


def test_mcp_oauth_values_reach_the_config(tmp_path: Path) -> None:
    """``mcp.resourceMetadata`` and the servers' and tools' ``scopes`` become the gateway's
    ``resource_metadata`` and ``scopes`` (docs/mcp.md, OAuth); the schema refuses a resource
    with a path and a scope the OAuth syntax does not allow."""
    from gateway.mcp.settings import McpSettings

    meta = {"resource": "https://gw.example.eu", "authorization_servers": ["https://id.example.eu"],
            "required_scopes": ["mcp"]}
    server = {**SERVER, "scopes": ["search"],
              "tools": {"fetch": {"url_arguments": ["url"], "scopes": ["search:fetch"]}}}
    values, policy = _mcp_values(tmp_path, [server])
    raw = yaml.safe_load(values.read_text(encoding="utf-8"))
    raw["mcp"]["resourceMetadata"] = meta
    values.write_text(yaml.safe_dump(raw), encoding="utf-8")
    objs = h.render(h.SCENARIOS["default"], values, policy=policy)
    config = yaml.safe_load(h.one(objs, "ConfigMap", "sg-sovereign-gateway-config")
                            ["data"]["config.yaml"])
    assert config["mcp"]["resource_metadata"] == meta
    assert config["mcp"]["servers"][0]["scopes"] == ["search"]
    assert config["mcp"]["servers"][0]["tools"]["fetch"]["scopes"] == ["search:fetch"]
    McpSettings.model_validate(config["mcp"])
    for i, bad in enumerate(({**meta, "resource": "https://gw.example.eu/mcp"},
                             {**meta, "required_scopes": ['a"b']})):
        work = tmp_path / f"bad{i}"
        work.mkdir()
        values, policy = _mcp_values(work, [SERVER], {})
        raw = yaml.safe_load(values.read_text(encoding="utf-8"))
        raw["mcp"]["resourceMetadata"] = bad
        values.write_text(yaml.safe_dump(raw), encoding="utf-8")
        assert "resourceMetadata" in h.refuse(h.SCENARIOS["default"], values, policy=policy)
