"""A replica's address is written once: in the policy destination it names.

Before, "Point it at your own vLLM" made the operator write each replica URL twice, in
``gateway.yaml`` (``replicas[].url``) and in ``policy.yaml`` (``destinations[].url``), and a
replica without ``url`` was refused (``required key is missing``). Now a replica given as
``{destination: ID}`` is served at that destination's ``url``; a replica that still gives its
``url`` works as before (it must lie inside its destination); anything the policy cannot supply
is one problem naming the file, line and key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config.errors import InvalidConfig
from gateway.config.loader import load
from gateway.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

POLICY_EXTRA = """\
  - id: pool-host
    host: vllm.internal.example
    port: 8000
    region: eu-de-1
    jurisdiction: EU
    operator: platform-team
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    text = (REPO / "examples" / "policy.yaml").read_text(encoding="utf-8")
    text = text.replace("destinations:\n", "destinations:\n" + POLICY_EXTRA, 1)
    (tmp_path / "policy.yaml").write_text(text, encoding="utf-8")
    return tmp_path


def _write(site: Path, replicas: str, policy: str = "policy: {file: policy.yaml}\n") -> Path:
    path = site / "gateway.yaml"
    path.write_text("models:\n  - name: m\n    replicas:\n" + replicas + policy, encoding="utf-8")
    return path


def _problems(path: Path) -> list[tuple[int | None, str, str]]:
    with pytest.raises(InvalidConfig) as info:
        load(path, {})
    return [(p.line, p.key, p.problem) for p in info.value.problems]


def test_a_replica_naming_a_destination_is_served_at_its_url(site: Path) -> None:
    path = _write(site, "      - {destination: vllm-eu-1}\n      - {destination: vllm-eu-2}\n")
    settings = load(path, {})
    assert [r.url for r in settings.models[0].replicas] == [
        "http://10.0.0.11:8000", "http://10.0.0.12:8000"]
    assert [r.destination for r in settings.models[0].replicas] == ["vllm-eu-1", "vllm-eu-2"]


def test_moving_a_replica_is_one_edit_of_the_policy(site: Path) -> None:
    path = _write(site, "      - {destination: vllm-eu-1}\n")
    policy = site / "policy.yaml"
    policy.write_text(policy.read_text().replace("http://10.0.0.11:8000", "http://10.0.0.21:8001"))
    assert load(path, {}).models[0].replicas[0].url == "http://10.0.0.21:8001"


def test_a_replica_that_gives_its_url_still_works_and_is_still_bound(site: Path) -> None:
    from gateway.egress import load_policy

    ok = load(_write(site, "      - {url: 'http://10.0.0.11:8000', destination: vllm-eu-1}\n"), {})
    assert ok.models[0].replicas[0].url == "http://10.0.0.11:8000"
    assert load_policy(ok) is not None
    outside = load(_write(site, "      - {url: 'http://10.9.9.9:8000', destination: vllm-eu-1}\n"),
                   {})
    with pytest.raises(ConfigError, match=r"models\[0\]\.replicas\[0\]\.destination: replica "
                                          r"http://10\.9\.9\.9:8000: host is not destination"):
        load_policy(outside)


@pytest.mark.parametrize(("replica", "key", "problem"), [
    ("{destination: nope}", "destination",
     "destination 'nope' is not defined in policy"),
    ("{destination: provider-us}", "destination",
     "has url 'https://api.provider.example/v1', an API base, not a server root"),
    ("{destination: audit-db}", "destination",
     "has url 'postgresql://10.0.2.5:5432/audit', not an http:// or https:// server"),
    ("{destination: pool-host}", "destination",
     "is given as a host, not a url: give this replica's url"),
    ("{api_key_env: X}", "url", "required: the server root (http://HOST:PORT), or name a "
     "policy destination (destination: ID)"),
])
def test_what_the_policy_cannot_supply_is_one_problem_naming_the_key(
    site: Path, replica: str, key: str, problem: str,
) -> None:
    path = _write(site, f"      - {{destination: vllm-eu-1}}\n      - {replica}\n")
    found = [p for p in _problems(path) if p[1].startswith("models[0].replicas[1]")]
    [(line, got_key, got)] = [p for p in found if not p[1].endswith("api_key_env")]
    assert (line, got_key) == (5, f"models[0].replicas[1].{key}")
    assert problem in got, got


def test_without_a_policy_section_destination_cannot_supply_the_url(site: Path) -> None:
    path = _write(site, "      - {destination: vllm-eu-1}\n", policy="")
    assert _problems(path) == [(4, "models[0].replicas[0].url", "required: without a policy: "
                                "section, destination cannot supply it")]


def test_an_unreadable_policy_is_named_once_per_replica(site: Path) -> None:
    path = _write(site, "      - {destination: vllm-eu-1}\n",
                  policy="policy: {file: missing.yaml}\n")
    [(line, key, problem)] = _problems(path)
    assert (line, key) == (4, "models[0].replicas[0].url")
    assert "policy.file cannot be loaded" in problem and "missing.yaml" in problem


def test_check_config_and_policy_explain_see_the_url(site: Path) -> None:
    """The two CLIs that read the config: check-config (gateway) and policy explain (which
    reads the file on its own, the policy package never importing the gateway)."""
    path = _write(site, "      - {destination: vllm-eu-1}\n      - {destination: vllm-eu-2}\n")
    text = path.read_text() + ("keys:\n  - {id: a, sha256: '" + "ab" * 32 + "', models: [m], "
                               "team: analytics, data_class: internal}\n")
    path.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    check = subprocess.run([sys.executable, "-m", "gateway.cli", "check-config", "--config",
                            str(path)], capture_output=True, text=True, timeout=120, env=env,
                           cwd=site, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    explain = subprocess.run([sys.executable, "-m", "policy.cli", "explain", "policy.yaml",
                              "--key", "a", "--model", "m", "--config", str(path), "--json"],
                             capture_output=True, text=True, timeout=120, env=env, cwd=site,
                             check=False)
    assert explain.returncode == 0, explain.stdout + explain.stderr
    decisions = json.loads(explain.stdout)["decisions"]
    assert [(d["destination"], d["replica"], d["decision"]) for d in decisions] == [
        ("vllm-eu-1", "http://10.0.0.11:8000", "allow"),
        ("vllm-eu-2", "http://10.0.0.12:8000", "allow")]


@pytest.mark.parametrize(("destination", "problem"), [
    ("provider-us", "an API base, not a server root"),
    ("audit-db", "not an http:// or https:// server"),
])
def test_policy_explain_denies_what_check_config_refuses(
    site: Path, destination: str, problem: str,
) -> None:
    """A destination that cannot supply a replica's url (an API base, another scheme): the
    gateway refuses to start, so explain must not answer "allow" with that url. Before, explain
    took any destination url as is and allowed provider-us at https://api.provider.example/v1
    for public data."""
    path = _write(site, f"      - {{destination: {destination}}}\n")
    path.write_text(path.read_text() + ("keys:\n  - {id: a, sha256: '" + "ab" * 32 + "', "
                                        "models: [m], team: analytics, data_class: public}\n"))
    [(_, key, refused)] = _problems(path)
    assert key == "models[0].replicas[0].destination" and problem in refused
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    explain = subprocess.run([sys.executable, "-m", "policy.cli", "explain", "policy.yaml",
                              "--key", "a", "--model", "m", "--config", str(path), "--json"],
                             capture_output=True, text=True, timeout=120, env=env, cwd=site,
                             check=False)
    assert explain.returncode == 1, explain.stdout + explain.stderr
    [decision] = json.loads(explain.stdout)["decisions"]
    assert (decision["destination"], decision["replica"], decision["decision"]) == (
        destination, "?", "deny")
    assert problem in decision["reason"] and "gateway refuses to start" in decision["reason"]


@pytest.mark.parametrize("purpose", ["tool", "telemetry"])
@pytest.mark.parametrize("given_url", [False, True])
def test_a_replica_at_a_non_inference_destination_is_refused(
    site: Path, purpose: str, given_url: bool,
) -> None:
    """The rules cannot tell a prompt from a tool call: a rule that lets tool calls reach an
    MCP server's destination let a model replica there get prompts too. Before, check-config
    said OK and ``policy explain`` allowed it."""
    policy = site / "policy.yaml"
    policy.write_text(policy.read_text().replace("destinations:\n", (
        "destinations:\n  - {id: mcp-x, url: 'http://10.0.0.30:8443', region: eu-de-1, "
        f"jurisdiction: EU, operator: acme, purpose: {purpose}}}\n"), 1))
    url = "url: 'http://10.0.0.30:8443', " if given_url else ""
    path = _write(site, f"      - {{{url}destination: mcp-x}}\n")
    from gateway.egress import load_policy

    with pytest.raises(ConfigError) as info:
        load_policy(load(path, {}))
    assert info.value.message == (
        f"models[0].replicas[0].destination: destination 'mcp-x' has purpose '{purpose}'; "
        "a model replica needs one of purpose 'inference'")
