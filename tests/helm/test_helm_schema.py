"""values.schema.json refuses unsafe values, each with a message naming the key.

Every refusal is checked with real helm: the render fails, prints no manifest, and the error
names the offending value path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sg_helm as h
import yaml

SCHEMA = json.loads((h.CHART / "values.schema.json").read_text(encoding="utf-8"))
DEFAULT = h.SCENARIOS["default"]
ANY_ADDRESS = "value must be 'NOT 0.0.0.0/0 OR ::/0: an egress rule may never allow any address'"


def _values(tmp_path: Path, data: dict[str, object]) -> Path:
    path = tmp_path / "override.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-2", "europe-west6", "uksouth"])
def test_non_eu_region_is_refused_with_eu_only(tmp_path: Path, region: str) -> None:
    # eu-west-2 (London) and europe-west6 (Zurich) are European but not in the EU.
    err = h.refuse(DEFAULT, _values(tmp_path, {"sovereignty": {"allowedRegions": [region]}}))
    assert (f'sovereignty.allowedRegions: "{region}" is not in the built-in EU region list'
            in err), err
    assert f"add {{name: {region}, reason: ...}} to sovereignty.additionalRegions" in err


def test_the_templates_region_list_is_the_schemas() -> None:
    # helm's .Files cannot read values.schema.json: the templates read files/eu-regions.yaml.
    listed = yaml.safe_load((h.CHART / "files" / "eu-regions.yaml").read_text())["regions"]
    assert listed == SCHEMA["$defs"]["euRegion"]["enum"]


def test_an_own_region_is_allowed_once_named_with_a_reason(tmp_path: Path) -> None:
    # The example policy's regions (eu-de-1) are an operator's own: no built-in region is
    # forced next to them (the pre-flight would flag it as outside the allowed regions).
    own = _values(tmp_path, {"sovereignty": {
        "allowedRegions": ["eu-de-1"],
        "additionalRegions": [{"name": "eu-de-1", "reason": "own data centre, Frankfurt"},
                              {"name": "eu-fr-1", "reason": "own data centre, Paris"}]}})
    deploy = h.one(h.render(DEFAULT, own), "Deployment", "sg-sovereign-gateway")
    terms = deploy["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["eu-de-1", "eu-fr-1"]
    only_added = _values(tmp_path, {"sovereignty": {
        "allowedRegions": [],
        "additionalRegions": [{"name": "dc-fra-1", "reason": "own data centre, Frankfurt"}]}})
    deploy = h.one(h.render(DEFAULT, only_added), "Deployment", "sg-sovereign-gateway")
    terms = deploy["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["dc-fra-1"]


def test_the_values_files_own_additional_regions_example_is_valid(tmp_path: Path) -> None:
    # values.yaml shows an additionalRegions entry in a comment; it failed minLength (reason).
    text = (h.CHART / "values.yaml").read_text()
    example = text.split("additionalRegions: []", 1)[0].rsplit("e.g.", 1)[1]
    entries = yaml.safe_load(" ".join(line.strip().lstrip("#").strip()
                                      for line in example.splitlines()).split(". ", 1)[0])
    assert entries and all(len(e["reason"]) >= 10 for e in entries), entries
    extra = _values(tmp_path, {"sovereignty": {"additionalRegions": entries}})
    assert h.render(DEFAULT, extra)


def test_eu_region_list_is_one_documented_place() -> None:
    regions = SCHEMA["$defs"]["euRegion"]["enum"]
    assert {"eu-central-1", "westeurope", "europe-west3", "eusc-de-east-1"} <= set(regions)
    readme = (h.CHART / "README.md").read_text(encoding="utf-8")
    for region in regions:
        assert f"`{region}`" in readme, f"{region} missing from the chart README's region list"


def test_regions_can_be_extended_explicitly_with_a_reason(tmp_path: Path) -> None:
    extra = _values(tmp_path, {"sovereignty": {
        "allowedRegions": ["eu-central-1"],
        "additionalRegions": [{"name": "dc-fra-1", "reason": "own data centre, Frankfurt"}]}})
    objs = h.render(DEFAULT, extra)
    deploy = h.one(objs, "Deployment", "sg-sovereign-gateway")
    terms = deploy["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["eu-central-1", "dc-fra-1"]
    no_reason = _values(tmp_path, {"sovereignty": {"additionalRegions": [{"name": "dc-fra-1"}]}})
    assert "missing property 'reason'" in h.refuse(DEFAULT, no_reason)


def test_eu_only_off_accepts_other_regions(tmp_path: Path) -> None:
    extra = _values(tmp_path, {"sovereignty": {"euOnly": False, "allowedRegions": ["us-east-1"]}})
    assert h.render(DEFAULT, extra)


def test_empty_region_list_is_refused(tmp_path: Path) -> None:
    err = h.refuse(DEFAULT, _values(tmp_path, {"sovereignty": {"allowedRegions": []}}))
    assert ("sovereignty.allowedRegions and sovereignty.additionalRegions are both empty"
            in err), err


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0", "0.0.0.0/00"])
def test_any_address_egress_is_refused(tmp_path: Path, cidr: str) -> None:
    extra = _values(tmp_path, {"egress": {"destinations": [
        {"id": "everything", "cidrs": ["10.0.0.0/8", cidr],
         "ports": [{"port": 443, "protocol": "TCP"}], "fqdn": None}]}})
    err = h.refuse(DEFAULT, extra)
    assert f"at '/egress/destinations/0/cidrs/1': {ANY_ADDRESS}" in err


@pytest.mark.parametrize(("key", "path"), [
    ({"audit": {"store": {"type": "postgresql", "postgresql": {
        "existingSecret": "db", "cidrs": ["::/0"]}}}, "replicaCount": 1},
     "/audit/store/postgresql/cidrs/0"),
    ({"telemetry": {"enabled": True, "endpoint": "http://c:4318", "cidrs": ["0.0.0.0/0"]}},
     "/telemetry/cidrs/0"),
])
def test_any_address_is_refused_for_database_and_collector(
        tmp_path: Path, key: dict[str, object], path: str) -> None:
    err = h.refuse(DEFAULT, _values(tmp_path, key))
    assert f"at '{path}': {ANY_ADDRESS}" in err


def test_cidr_without_prefix_is_refused(tmp_path: Path) -> None:
    extra = _values(tmp_path, {"egress": {"destinations": [
        {"id": "x", "cidrs": ["10.1.2.3"], "ports": [{"port": 443}], "fqdn": None}]}})
    assert "at '/egress/destinations/0/cidrs/0': '10.1.2.3' does not match pattern" in h.refuse(
        DEFAULT, extra)


def test_destination_without_ports_is_refused(tmp_path: Path) -> None:
    extra = _values(tmp_path, {"egress": {"destinations": [
        {"id": "x", "cidrs": ["10.1.2.0/24"], "ports": [], "fqdn": None}]}})
    assert "at '/egress/destinations/0/ports': minItems: got 0, want 1" in h.refuse(DEFAULT, extra)


@pytest.mark.parametrize("override", [{"replicaCount": 3}, {"autoscaling": {"enabled": True}}])
def test_several_replicas_on_sqlite_are_refused(
        tmp_path: Path, override: dict[str, object]) -> None:
    err = h.refuse(DEFAULT, _values(tmp_path, override))
    assert "at '/audit/store/type': value must be 'postgresql'" in err


def test_several_replicas_need_a_shared_checkpoint_volume(tmp_path: Path) -> None:
    extra = _values(tmp_path, {"audit": {"checkpoints": {"accessModes": ["ReadWriteOnce"]}}})
    err = h.refuse(h.SCENARIOS["postgres-ha"], extra)
    assert "audit.checkpoints.accessModes must include ReadWriteMany" in err


def test_postgresql_needs_its_secret(tmp_path: Path) -> None:
    extra = _values(tmp_path, {"replicaCount": 2, "audit": {"store": {
        "type": "postgresql", "postgresql": {"cidrs": ["10.40.0.5/32"]}}}})
    err = h.refuse(DEFAULT, extra)
    assert "at '/audit/store/postgresql/existingSecret': minLength: got 0, want 1" in err


def test_postgresql_needs_its_address_for_the_egress_policy(tmp_path: Path) -> None:
    extra = _values(tmp_path, {"audit": {"store": {
        "type": "postgresql", "postgresql": {"existingSecret": "db"}}}})
    assert "audit.store.postgresql.cidrs is empty" in h.refuse(DEFAULT, extra)


def test_missing_audit_signing_key_secret_is_refused(tmp_path: Path) -> None:
    err = h.refuse(DEFAULT, _values(tmp_path, {"audit": {"signingKey": {"existingSecret": ""}}}))
    assert "at '/audit/signingKey/existingSecret': minLength: got 0, want 1" in err
    # The chart's own defaults do not carry a key either: installing needs one.
    res = h.helm("template", "sg", str(h.CHART), "--set-file",
                 f"policy.document={h.POLICY_FILE}")
    assert res.returncode != 0
    assert "at '/audit/signingKey/existingSecret': minLength: got 0, want 1" in res.stderr


def test_missing_audit_pseudonym_key_secret_is_refused(tmp_path: Path) -> None:
    err = h.refuse(DEFAULT, _values(tmp_path, {"audit": {"pseudonymKey": {"existingSecret": ""}}}))
    assert "at '/audit/pseudonymKey/existingSecret': minLength: got 0, want 1" in err


def test_no_model_is_refused(tmp_path: Path) -> None:
    err = h.refuse(DEFAULT, _values(tmp_path, {"gateway": {"models": []}}))
    assert "no model configured: set gateway.models" in err


def test_missing_policy_document_is_refused() -> None:
    err = h.refuse(DEFAULT, policy=None)
    assert "policy.document is empty" in err


@pytest.mark.parametrize(("override", "message"), [
    ({"securityContext": {"runAsNonRoot": False}}, "at '/securityContext/runAsNonRoot'"),
    ({"securityContext": {"readOnlyRootFilesystem": False}},
     "at '/securityContext/readOnlyRootFilesystem'"),
    ({"securityContext": {"allowPrivilegeEscalation": True}},
     "at '/securityContext/allowPrivilegeEscalation'"),
    ({"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}},
     "at '/securityContext/capabilities/add'"),
    ({"podSecurityContext": {"runAsUser": 0}}, "at '/podSecurityContext/runAsUser'"),
])
def test_hardening_cannot_be_switched_off(
        tmp_path: Path, override: dict[str, object], message: str) -> None:
    assert message in h.refuse(DEFAULT, _values(tmp_path, override))


def test_vllm_revision_must_be_a_pinned_commit(tmp_path: Path) -> None:
    extra = _values(tmp_path, {"vllm": {"enabled": True, "models": [{
        "name": "m", "servedModelName": "org/m", "revision": "main", "storeClaim": "store"}]}})
    err = h.refuse(DEFAULT, extra)
    assert "at '/vllm/models/0/revision': 'main' does not match pattern '^[0-9a-f]{40}$'" in err


def test_unknown_value_key_is_refused(tmp_path: Path) -> None:
    err = h.refuse(DEFAULT, _values(tmp_path, {"networkPolicy": {"enable": False}}))
    assert "additional properties 'enable' not allowed" in err


def test_image_digest_must_be_sha256(tmp_path: Path) -> None:
    err = h.refuse(DEFAULT, _values(tmp_path, {"image": {"digest": "latest"}}))
    assert "at '/image/digest'" in err
