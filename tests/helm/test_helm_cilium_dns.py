"""The Cilium flavour lets the gateway resolve only the names it needs (DNS is a data channel).

Through the cluster DNS, which recurses, a query for ``<secret>.attacker.example`` reaches the
attacker's name server; Cilium's DNS proxy (``toPorts[].rules.dns``) refuses every name that is
not listed. The list is the policy's hostname destinations, the in-chart vLLM Services and the
operator's extra patterns; a pattern made only of wildcards is refused by the schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sg_helm as h
import yaml


def _dns_rules(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (cnp,) = h.by_kind(objs, "CiliumNetworkPolicy")
    rules = [r for r in cnp["spec"]["egress"] if "toEndpoints" in r
             and any(p["port"] == "53" for tp in r["toPorts"] for p in tp["ports"])]
    return [d for r in rules for tp in r["toPorts"] for d in tp["rules"]["dns"]]


def _values(scenario: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(h.SCENARIOS[scenario].read_text(encoding="utf-8"))
    return data


def test_dns_is_limited_to_the_policy_hostnames_and_given_patterns() -> None:
    values = _values("cilium")
    rules = _dns_rules(h.render(h.SCENARIOS["cilium"]))
    names = {r["matchName"] for r in rules if "matchName" in r}
    patterns = {r["matchPattern"] for r in rules if "matchPattern" in r}
    assert names == {d["fqdn"] for d in values["egress"]["destinations"] if d["fqdn"]}
    assert patterns == set(values["egress"]["dns"]["ciliumMatchPatterns"])
    assert all(set(p) - {"*", "."} for p in patterns), "a bare wildcard reopens DNS"


def test_in_chart_vllm_services_are_resolvable_by_their_cluster_name() -> None:
    objs = h.render(h.SCENARIOS["vllm"], sets={"networkPolicy.flavor": "cilium"})
    rules = _dns_rules(objs)
    names = {r["matchName"] for r in rules if "matchName" in r}
    services = [o["metadata"]["name"] for o in h.by_kind(objs, "Service")
                if o["metadata"]["labels"].get("app.kubernetes.io/component") == "vllm"]
    assert len(services) == len(_values("vllm")["vllm"]["models"])
    want = {f"{svc}.{h.NAMESPACE}.svc.cluster.local" for svc in services}
    fqdns = {d["fqdn"] for d in _values("vllm")["egress"]["destinations"]
             if d["fqdn"] and not d["id"].startswith("vllm-")}
    assert names == want | fqdns
    assert not [r for r in rules if "matchPattern" in r]


def test_only_address_destinations_render_no_dns_egress(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    doc = yaml.safe_load((h.VALUES / "policy.yaml").read_text(encoding="utf-8"))
    doc["destinations"] = [d for d in doc["destinations"] if d["id"] == "vllm-external"]
    policy.write_text(yaml.safe_dump(doc), encoding="utf-8")
    extra = tmp_path / "cidr-only.yaml"
    extra.write_text(yaml.safe_dump({
        "networkPolicy": {"flavor": "cilium"},
        "egress": {"destinations": [
            {"id": "vllm-external", "cidrs": ["10.20.0.0/24"],
             "ports": [{"port": 8000, "protocol": "TCP"}], "fqdn": None}]},
    }), encoding="utf-8")
    objs = h.render(h.SCENARIOS["default"], extra, policy=policy)
    assert _dns_rules(objs) == []
    (cnp,) = h.by_kind(objs, "CiliumNetworkPolicy")
    assert cnp["spec"]["egress"], "the CIDR destination is still allowed"


def test_bare_wildcard_pattern_is_refused(tmp_path: Path) -> None:
    for pattern in ("*", "**.", "*.*"):
        extra = tmp_path / "wildcard.yaml"
        extra.write_text(yaml.safe_dump({"egress": {"dns": {"ciliumMatchPatterns": [pattern]}}}),
                         encoding="utf-8")
        err = h.refuse(h.SCENARIOS["cilium"], extra)
        assert "ciliumMatchPatterns" in err, err
