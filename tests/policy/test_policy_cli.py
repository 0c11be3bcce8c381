"""The ``policy`` CLI through its real entry point (error boundary and exit codes included)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from policy_testdata import BASE

from policy import Policy, RenderError
from policy import Principal as PolicyPrincipal
from policy.cli import main
from policy.render import helm_values, networkpolicy

ROOT = Path(__file__).resolve().parents[2]
HELM_VALUES = ROOT / "tests" / "helm" / "values"
CHART = ROOT / "helm" / "sovereign-gateway"


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(BASE)
    return path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([*args])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_ok_prints_summary(policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "check", str(policy_file))
    assert code == 0
    assert Policy.from_file(policy_file).revision in out
    for word in ("vllm-eu-a", "provider-us", "non-EU", "sensitive-eu-no-retention", "deny"):
        assert word in out


def test_check_json(policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "check", str(policy_file), "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] is True
    assert data["destinations_by_jurisdiction"] == {
        "EU": {"eu-de-1": ["vllm-eu-a", "audit-db"], "eu-fr-1": ["vllm-eu-b"]},
        "non-EU": {"us-east-1": ["provider-us"]},
    }
    assert [r["id"] for r in data["rules"]] == [
        "block-contractor", "sensitive-eu-no-retention", "internal-eu", "public-anywhere"]


def test_check_invalid_policy_exits_1_naming_file_line_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE.replace("effect: deny", "effect: block"))
    code, out, err = _run(capsys, "check", str(bad))
    line = BASE.splitlines().index("    effect: deny") + 1
    assert code == 1 and out == ""
    assert err.startswith(f"policy: error [invalid_policy]: {bad}:{line}: rules[0].effect: ")
    assert len(err.strip().splitlines()) == 1  # one clear line, no traceback


def test_check_prints_every_problem_as_file_line_key_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One error line per problem in the gateway's ``file:line: key: problem`` shape, with
    our wording instead of pydantic's ("Extra inputs are not permitted", "Field required")."""
    bad = tmp_path / "bad.yaml"
    text = (BASE.replace("    effect: deny\n", "    effect: deny\n    efect: allow\n")
            .replace("    operator: provider-inc\n", ""))
    bad.write_text(text)
    code, out, err = _run(capsys, "check", str(bad))
    lines = text.splitlines()
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"policy: error [invalid_policy]: {bad}:{lines.index('  - id: provider-us') + 1}: "
        "destinations[2].operator: required key is missing",
        f"policy: error [invalid_policy]: {bad}:{lines.index('    efect: allow') + 1}: "
        "rules[0].efect: unknown key (did you mean 'effect'?)",
    ]
    code, out, _ = _run(capsys, "check", str(bad), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and doc["error"]["code"] == "invalid_policy"
    assert [(p["file"], p["key"], p["problem"]) for p in doc["problems"]] == [
        (str(bad), "destinations[2].operator", "required key is missing"),
        (str(bad), "rules[0].efect", "unknown key (did you mean 'effect'?)")]


def test_unreadable_file_and_usage_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(capsys, "check", str(tmp_path / "missing.yaml"))[0] == 2
    assert _run(capsys, "check")[0] == 2
    assert _run(capsys, "frobnicate")[0] == 2


def test_unsafe_allow_all_is_shouted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "dev.yaml"
    p.write_text(BASE + "unsafe_allow_all: true\n")
    code, out, _ = _run(capsys, "check", str(p))
    assert code == 0 and "WARNING: unsafe_allow_all is on" in out


# --- explain -----------------------------------------------------------------------------------

GATEWAY = textwrap.dedent(
    """\
    policy: {file: policy.yaml}
    models:
      - name: llama
        aliases: [default]
        replicas:
          - {url: http://10.20.0.11:8000, destination: vllm-eu-a}
          - {url: http://10.20.0.12:8000, destination: vllm-eu-b}
          - {url: http://10.20.0.13:8000}
          - {url: http://10.20.0.99:8000, destination: vllm-eu-a}
    keys:
      - {id: k-conf, sha256: x, team: engineering, data_class: confidential}
      - {id: k-r, sha256: x, team: research, data_class: confidential}
      - {id: k-default, sha256: x}
    """
)


@pytest.fixture
def gateway_file(tmp_path: Path) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(GATEWAY)
    return path


def test_explain_from_gateway_config(
    policy_file: Path, gateway_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "explain", str(policy_file), "--key", "k-conf", "--model",
                        "default", "--config", str(gateway_file), "--json")
    data = json.loads(out)
    assert code == 0
    assert (data["data_class"], data["team"], data["allowed"]) == (
        "confidential", "engineering", ["vllm-eu-a"])
    got = [(d["destination"], d["decision"], d["rule_id"], d["replica"]) for d in data["decisions"]]
    assert got == [
        ("vllm-eu-a", "allow", "sensitive-eu-no-retention", "http://10.20.0.11:8000"),
        ("vllm-eu-b", "deny", "sensitive-eu-no-retention", "http://10.20.0.12:8000"),
        ("", "deny", None, "http://10.20.0.13:8000"),
        ("vllm-eu-a", "deny", None, "http://10.20.0.99:8000"),
    ]
    assert "host is not destination vllm-eu-a" in data["decisions"][3]["reason"]
    assert "lacks no-retention" in data["decisions"][1]["reason"]


def test_explain_of_a_config_without_policy_says_nothing_is_enforced(
    policy_file: Path, gateway_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gateway serve`` with no ``policy:`` section starts (check-config says OK) and sends a
    request to every replica of the model, whatever the class: explain says that, not what
    FILE's rules would decide (before: allow vllm-eu-a by a rule, deny vllm-eu-b; both were
    in fact used)."""
    gateway_file.write_text(GATEWAY.replace("policy: {file: policy.yaml}\n", ""))
    args = ["explain", str(policy_file), "--key", "k-conf", "--model", "default", "--config",
            str(gateway_file)]
    code, out, _ = _run(capsys, *args, "--json")
    data = json.loads(out)
    assert code == 0 and data["enforced"] is False and data["revision"] is None
    assert [(d["replica"], d["decision"], d["rule_id"], d["policy_revision"])
            for d in data["decisions"]] == [
        (f"http://10.20.0.{n}:8000", "allow", None, None) for n in (11, 12, 13, 99)]
    assert all("no policy: section" in d["reason"] and "not applied" in d["reason"]
               for d in data["decisions"])
    code, out, _ = _run(capsys, *args)
    assert code == 0 and "egress is NOT restricted" in out
    assert "sensitive-eu-no-retention" not in out and "deny" not in out
    # A replica with only a destination: without a policy the gateway refuses to start.
    gateway_file.write_text(GATEWAY.replace("policy: {file: policy.yaml}\n", "").replace(
        "{url: http://10.20.0.13:8000}", "{destination: vllm-eu-a}"))
    code, out, _ = _run(capsys, *args, "--json")
    data = json.loads(out)
    refused = [d for d in data["decisions"] if d["decision"] == "deny"]
    assert code == 0 and len(refused) == 1
    assert "gateway refuses to start" in refused[0]["reason"]


def test_explain_of_a_config_using_another_policy_file_is_a_usage_error(
    policy_file: Path, gateway_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(BASE.replace("public-anywhere", "public-anywhere-2"))
    gateway_file.write_text(GATEWAY.replace("policy.yaml", "other.yaml"))
    code, _, err = _run(capsys, "explain", str(policy_file), "--key", "k-conf", "--model",
                        "default", "--config", str(gateway_file))
    assert code == 2 and "other.yaml" in err and "not" in err
    # The same file under another spelling is fine.
    gateway_file.write_text(GATEWAY.replace("policy.yaml", "./policy.yaml"))
    assert _run(capsys, "explain", str(policy_file), "--key", "k-conf", "--model", "default",
                "--config", str(gateway_file))[0] == 0


def test_explain_class_change_needs_a_grant(
    policy_file: Path, gateway_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["explain", str(policy_file), "--model", "llama", "--config", str(gateway_file)]
    code, _, err = _run(capsys, *base, "--key", "k-conf", "--class", "public")
    assert code == 1 and "may not lower its data class" in err
    code, out, _ = _run(capsys, *base, "--key", "k-r", "--class", "internal", "--json")
    assert code == 0 and json.loads(out)["allowed"] == ["vllm-eu-a", "vllm-eu-b"]
    code, out, _ = _run(capsys, *base, "--key", "k-default", "--json")
    assert json.loads(out)["data_class"] == "internal"  # the gateway's default


def test_explain_without_config_nothing_allowed_exits_1(
    policy_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "explain", str(policy_file), "--key", "k", "--team",
                        "contractors", "--class", "public", "--destination", "vllm-eu-a",
                        "--destination", "provider-us")
    assert code == 1
    assert "block-contractor" in out and "the gateway answers 403" in out
    assert "requires jurisdiction EU" not in out  # (a deny rule decided, not a constraint)
    code, out, _ = _run(capsys, "explain", str(policy_file), "--key", "k", "--class", "public")
    assert code == 0 and out.count("allowed by rule public-anywhere") == 3


def test_explain_is_the_library_explain(
    policy_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pol = Policy.from_file(policy_file)
    for team, data_class in [("engineering", "confidential"), ("contractors", "public"),
                             (None, "internal")]:
        args = ["explain", str(policy_file), "--key", "k", "--class", data_class, "--json"]
        if team:
            args += ["--team", team]
        out = json.loads(_run(capsys, *args)[1])
        want = pol.explain(PolicyPrincipal("k", team), data_class)
        assert [{k: v for k, v in d.items() if k != "replica"} for d in out["decisions"]] == [
            d.as_record() for d in want]
        assert out["allowed"] == [d.destination_id for d in want if d.allowed]


def test_explain_usage_errors(
    policy_file: Path, gateway_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(capsys, "explain", str(policy_file), "--key", "k")[0] == 2  # no class
    code, _, err = _run(capsys, "explain", str(policy_file), "--key", "nobody", "--config",
                        str(gateway_file))
    assert code == 2 and "key 'nobody' is not in gateway config" in err
    code, _, err = _run(capsys, "explain", str(policy_file), "--key", "k", "--class", "secret")
    assert code == 2 and "not defined" in err


# --- networkpolicy -----------------------------------------------------------------------------

def test_helm_values_match_the_chart_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "networkpolicy", str(HELM_VALUES / "policy.yaml"),
                        "--format", "helm-values")
    assert code == 0
    rendered = yaml.safe_load(out)
    # The chart's own test values record what this command prints for its policy.
    expected = yaml.safe_load((HELM_VALUES / "default.yaml").read_text())["egress"]
    assert rendered == {"egress": expected}
    schema = json.loads((CHART / "values.schema.json").read_text())
    sub = {**schema["properties"]["egress"], "$defs": schema.get("$defs", {})}
    jsonschema.validate(rendered["egress"], sub)


def test_networkpolicy_is_valid_kubernetes(
    policy_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, "networkpolicy", str(policy_file), "--namespace", "sg",
                          "--pod-selector", "app=gw", "--pod-selector", "tier=edge")
    doc = yaml.safe_load(out)
    assert code == 0
    kubernetes_validate.validate(doc, kubernetes_validate.utils.latest_version(), strict=True)
    spec = doc["spec"]
    assert spec["podSelector"] == {"matchLabels": {"app": "gw", "tier": "edge"}}
    assert spec["policyTypes"] == ["Egress"]
    blocks = [(t["ipBlock"]["cidr"], [p["port"] for p in r["ports"]])
              for r in spec["egress"] for t in r["to"] if "ipBlock" in t]
    assert blocks == [("10.30.0.5/32", [5432]), ("10.20.0.11/32", [8000]),
                      ("10.20.0.12/32", [8000])]
    # The hostname destination cannot be expressed without resolving: it is named, not dropped.
    assert doc["metadata"]["annotations"]["sovereign-gateway/unenforced-fqdns"] == (
        "api.provider.example:443")
    assert "api.provider.example:443" in err and "--format cilium" in err
    assert "0.0.0.0/0" not in out and "::/0" not in out


def test_networkpolicy_resolve_snapshots_hostnames(policy_file: Path) -> None:
    doc = networkpolicy(Policy.from_file(policy_file),
                        resolve=lambda host, port: ["203.0.113.7", "2001:db8::7"])
    cidrs = [t["ipBlock"]["cidr"] for r in doc["spec"]["egress"] for t in r["to"]
             if "ipBlock" in t]
    assert "203.0.113.7/32" in cidrs and "2001:db8::7/128" in cidrs
    assert "sovereign-gateway/unenforced-fqdns" not in doc["metadata"]["annotations"]
    with pytest.raises(RenderError, match="cloud metadata"):
        networkpolicy(Policy.from_file(policy_file), resolve=lambda h, p: ["169.254.169.254"])


def test_cilium_variant_uses_fqdns(policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "networkpolicy", str(policy_file), "--format", "cilium")
    doc = yaml.safe_load(out)
    assert code == 0 and doc["kind"] == "CiliumNetworkPolicy"
    rules: list[dict[str, Any]] = doc["spec"]["egress"]
    assert {"toFQDNs": [{"matchName": "api.provider.example"}],
            "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}]} in rules
    dns = next(r for r in rules if "toEndpoints" in r)
    assert dns["toPorts"][0]["rules"]["dns"] == [{"matchName": "api.provider.example"}]


def test_any_address_is_refused_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "wide.yaml"
    p.write_text(BASE.replace("url: http://10.20.0.11:8000", "cidr: 0.0.0.0/0\n    ports: [443]"))
    code, out, err = _run(capsys, "networkpolicy", str(p), "--format", "helm-values")
    assert code == 1 and out == ""
    assert "destinations[0]: a destination may not cover every address (/0)" in err
    # Defence in depth: a document that bypassed validation is still refused by the renderer.
    policy = Policy.from_text(BASE)
    wide = policy.document.destinations[0].model_copy()
    object.__setattr__(wide, "_endpoint", type(wide.endpoint)(
        None, __import__("ipaddress").ip_network("::/0"), frozenset({443}), (), None))
    doc = policy.document.model_copy(update={"destinations": [wide]})
    with pytest.raises(RenderError, match="would allow every address"):
        helm_values(Policy(doc, policy.revision))


def test_text_output_keeps_brackets(policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Reasons contain [..] lists; the table renderer must not eat them as markup.
    code, out, _ = _run(capsys, "explain", str(policy_file), "--key", "k", "--class",
                        "confidential", "--destination", "vllm-eu-b")
    assert code == 1 and "requires tags [no-retention]; vllm-eu-b lacks no-retention" in out


def test_example_policy_matches_example_gateway_config(capsys: pytest.CaptureFixture[str]) -> None:
    example = ROOT / "examples" / "policy.yaml"
    gateway = ROOT / "examples" / "gateway.yaml"
    policy = Policy.from_file(example)
    raw = yaml.safe_load(gateway.read_text())
    for model in raw["models"]:
        for replica in model["replicas"]:
            assert policy.destination(replica["destination"]).purpose == "inference"
    code, out, _ = _run(capsys, "explain", str(example), "--config", str(gateway), "--key",
                        "team-a", "--model", "default", "--class", "confidential", "--json")
    data = json.loads(out)
    assert code == 0 and data["allowed"] == ["vllm-eu-1"]
    assert _run(capsys, "networkpolicy", str(example), "--format", "helm-values")[0] == 0


@pytest.mark.parametrize(
    ("target", "extra", "code", "needle"),
    [
        ("169.254.169.254:80", [], 1, "always denied"),
        ("2852039166:80", [], 1, "always denied"),
        ("[::ffff:10.20.0.11]:8000", [], 0, "address of destination vllm-eu-a"),
        ("10.20.0.11:8001", [], 1, "no destination allows 10.20.0.11:8001"),
        ("exfil.example:443", [], 1, "no destination names exfil.example:443"),
        ("API.Provider.Example.:443", ["--resolved", "203.0.113.5"], 0,
         "pinned address of api.provider.example"),
        ("api.provider.example:443", ["--resolved", "203.0.113.5", "--resolved", "127.0.0.1"],
         1, "resolved to 127.0.0.1 (loopback"),
    ],
)
def test_connect_answers_like_the_guard(
    policy_file: Path, capsys: pytest.CaptureFixture[str], target: str, extra: list[str],
    code: int, needle: str,
) -> None:
    got, out, _ = _run(capsys, "connect", str(policy_file), target, *extra, "--json")
    data = json.loads(out)
    assert got == code and data["allowed"] is (code == 0)
    assert any(needle in c["reason"] for c in data["checks"]), data["checks"]


@pytest.mark.parametrize("target", ["localhost:8000", "LocalHost.:22"])
def test_connect_to_a_local_name_asks_for_its_address(
    policy_file: Path, capsys: pytest.CaptureFixture[str], target: str,
) -> None:
    # The guard lets the process look up localhost and checks the address it connects to, so
    # without that address there is no verdict: a usage error that says what to add, never a
    # silent exit 1.
    code, out, err = _run(capsys, "connect", str(policy_file), target)
    assert (code, out) == (2, "")
    host = target.rsplit(":", 1)[0]
    assert f"{host!r} is resolved by the host" in err and "--resolved ADDRESS" in err
    code, out, _ = _run(capsys, "connect", str(policy_file), target, "--resolved", "127.0.0.1",
                        "--json")
    data = json.loads(out)
    assert code == 1 and data["allowed"] is False
    assert [(c["check"], c["allowed"]) for c in data["checks"]] == [
        ("lookup", True), ("connect 127.0.0.1", False)]


def test_schema_describes_the_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "schema")
    schema = json.loads(out)
    assert code == 0 and schema["additionalProperties"] is False
    assert {"version", "data_classes", "destinations", "rules"} <= set(schema["properties"])
    jsonschema.validate(yaml.safe_load(BASE), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**yaml.safe_load(BASE), "unknown": 1}, schema)
