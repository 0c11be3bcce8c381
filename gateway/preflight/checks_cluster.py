"""Cluster checks: default-deny egress, peers = policy destinations, node regions, pod
environment (telemetry and hub switches, OTLP/proxy targets), images by digest.

Each function takes :class:`~gateway.preflight.inputs.Facts` and returns one
:class:`~gateway.preflight.report.CheckResult`; a missing input gives ``skip``.
Label selectors follow the Kubernetes ``LabelSelector`` semantics (``matchLabels`` AND
``matchExpressions`` with ``In``/``NotIn``/``Exists``/``DoesNotExist``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from clishell.text import counted
from gateway.preflight.inputs import Facts, Workload
from gateway.preflight.report import CheckResult, skipped

__all__ = ["check_default_deny", "check_env", "check_images", "check_node_regions",
           "destination_peers", "selects"]

#: Switches that must be "1" in every container (vLLM usage stats, HF Hub access/telemetry).
TELEMETRY_SWITCHES = ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "HF_HUB_OFFLINE",
                      "HF_HUB_DISABLE_TELEMETRY")
_TARGET_VARS = re.compile(r"^(OTEL_EXPORTER_OTLP(_[A-Z]+)?_ENDPOINT|(HTTPS?|ALL|FTP)_PROXY)$",
                          re.IGNORECASE)
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_DNS_PORT = 53


def selects(selector: Any, labels: dict[str, str]) -> bool:
    """Whether a Kubernetes ``LabelSelector`` selects ``labels`` (empty selects all)."""
    sel = selector if isinstance(selector, dict) else {}
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(str(k)) != str(v):
            return False
    for e in sel.get("matchExpressions") or ():
        key, op, vals = str(e.get("key")), e.get("operator"), [str(v) for v in e.get("values")
                                                                 or ()]
        if (op == "In" and labels.get(key) not in vals) or (
                op == "NotIn" and labels.get(key) in vals) or (
                op == "Exists" and key not in labels) or (
                op == "DoesNotExist" and key in labels):
            return False
    return True


def _np_name(np: dict[str, Any]) -> str:
    return str((np.get("metadata") or {}).get("name"))


def destination_peers(policy: Any) -> tuple[set[tuple[str, int]], list[str]]:
    """``{(cidr, port)}`` a NetworkPolicy must allow for the policy's destinations.

    Returns:
        The pairs, and the ids of hostname destinations without addresses (a plain
        NetworkPolicy cannot name hosts; in-chart Services are allowed by pod selector).
    """
    pairs: set[tuple[str, int]] = set()
    hostnames: list[str] = []
    for d in policy.destinations.values():
        ep = d.endpoint
        nets = [ep.network] if ep.network is not None else list(ep.resolves_to)
        if not nets:
            hostnames.append(d.id)
        pairs |= {(str(n), p) for n in nets for p in ep.ports}
    return pairs, sorted(hostnames)


def _rule_pairs(rule: dict[str, Any], release: list[Workload]) -> tuple[set[tuple[str, int]],
                                                                        list[str]]:
    ports = [int(p["port"]) for p in rule.get("ports") or () if isinstance(p.get("port"), int)]
    pairs: set[tuple[str, int]] = set()
    problems: list[str] = []
    if not rule.get("to"):
        problems.append("an egress rule without `to` allows every destination")
    if not ports:
        problems.append("an egress rule without ports allows every port")
    for peer in rule.get("to") or ():
        block = peer.get("ipBlock")
        if isinstance(block, dict):
            net = ipaddress.ip_network(str(block.get("cidr")), strict=False)
            if net.prefixlen == 0:
                problems.append(f"ipBlock {net} allows every address")
            pairs |= {(str(net), p) for p in ports}
        elif ports and set(ports) == {_DNS_PORT}:
            continue  # cluster DNS (the chart's DNS rule)
        elif "podSelector" in peer and "namespaceSelector" not in peer and any(
                selects(peer["podSelector"], w.labels) for w in release):
            continue  # in-release backends (in-chart vLLM)
        else:
            problems.append(f"peer {peer} is neither a policy address nor in the release")
    return pairs, problems


def _covers_everything(cidrs: set[str]) -> list[str]:
    """``ipBlocks ... together allow every IPv4 address`` for each family the union of
    ``cidrs`` holds whole, whatever the ports (``policy.whole_families``), else nothing."""
    from policy import whole_families

    nets = [ipaddress.ip_network(c, strict=False) for c in cidrs]
    return [f"ipBlocks {', '.join(sorted(cidrs))} together allow every "
            f"IPv{ipaddress.ip_network(w).version} address, as {w} would"
            for w in whole_families(nets)]


def check_default_deny(facts: Facts) -> CheckResult:
    """Default-deny egress selects every release pod; gateway peers equal the destinations."""
    cid, title, crit = ("k8s.default-deny", "default-deny egress NetworkPolicy selects every "
                        "pod; allowed peers = policy destinations", ("SOV-3", "SOV-7"))
    if facts.networkpolicies is None or facts.workloads is None:
        return skipped(cid, title, "no Helm values, manifests or kubeconfig given", crit)
    wls, nps = facts.workloads, facts.networkpolicies
    deny = [np for np in nps if "Egress" in ((np.get("spec") or {}).get("policyTypes") or ())
            and not (np.get("spec") or {}).get("egress")]
    unselected = [w.name for w in wls
                  if not any(selects((np.get("spec") or {}).get("podSelector"), w.labels)
                             for np in deny)]
    problems: list[str] = []
    if not wls:
        problems.append("no pods of the release found")
    if unselected:
        problems.append(f"no default-deny egress policy selects {', '.join(unselected)}")
    gateway = [w for w in wls if w.labels.get("app.kubernetes.io/component") == "gateway"]
    actual: set[tuple[str, int]] = set()
    reach: dict[str, set[str]] = {}  # pod -> the ipBlock CIDRs its egress rules allow
    for np in nps:
        spec = np.get("spec") or {}
        if "Egress" not in (spec.get("policyTypes") or ()):
            continue
        if not any(selects(spec.get("podSelector"), w.labels) for w in wls):
            continue
        for rule in spec.get("egress") or ():
            pairs, bad = _rule_pairs(rule, wls)
            problems += [f"{_np_name(np)}: {b}" for b in bad]
            if any(selects(spec.get("podSelector"), w.labels) for w in gateway):
                actual |= pairs
            for w in wls:
                if selects(spec.get("podSelector"), w.labels):
                    reach.setdefault(w.name, set()).update(c for c, _ in pairs)
    for name, cidrs in sorted(reach.items()):
        problems += [f"{name}: {b}" for b in _covers_everything(cidrs)]
    evidence: dict[str, Any] = {
        "source": facts.workload_source, "pods": [w.name for w in wls],
        "default_deny": [_np_name(np) for np in deny],
        "networkpolicies": [_np_name(np) for np in nps],
        "allowed_peers": sorted(f"{c}:{p}" for c, p in actual),
    }
    if facts.policy is not None:
        expected, hostnames = destination_peers(facts.policy)
        evidence["policy_peers"] = sorted(f"{c}:{p}" for c, p in expected)
        evidence["hostname_destinations"] = hostnames
        extra, missing = actual - expected, expected - actual
        if extra:
            problems.append("peers not in the policy: " + ", ".join(
                sorted(f"{c}:{p}" for c, p in extra)))
        if missing and gateway:
            problems.append("policy destinations not allowed by any NetworkPolicy: " +
                            ", ".join(sorted(f"{c}:{p}" for c, p in missing)))
    else:
        evidence["policy_peers"] = None
    if problems:
        return CheckResult(cid, title, "fail", "; ".join(problems), evidence, crit)
    tail = "" if facts.policy is not None else " (no policy given: peers not compared)"
    policies = counted(len(deny), "default-deny policy", "default-deny policies")
    verdict = (f"{policies} {'selects' if len(deny) == 1 else 'select'} all "
               f"{counted(len(wls), 'pod')}; {counted(len(actual), 'allowed peer')}{tail}")
    return CheckResult(cid, title, "pass", verdict, evidence, crit)


def check_node_regions(facts: Facts) -> CheckResult:
    """Pods run on nodes labelled with allowed regions (API), or are pinned to them (manifests)."""
    cid, title, crit = ("k8s.node-regions", "pods run only on nodes in allowed regions",
                        ("SOV-3", "SOV-2"))
    if facts.workloads is None:
        return skipped(cid, title, "no Helm values, manifests or kubeconfig given", crit)
    allowed, label = set(facts.criteria.regions), facts.criteria.region_label
    allowed_from = "--region"
    if not allowed and facts.policy is not None:
        # One region model: without --region, the pods may run where the policy's destinations
        # in the allowed jurisdictions are (the regions the chart's affinity should name).
        jurisdictions = facts.criteria.jurisdictions
        allowed = {d.region for d in facts.policy.destinations.values()
                   if d.jurisdiction in jurisdictions}
        allowed_from = f"the policy's destinations in {', '.join(jurisdictions)}"
    if not allowed:
        return skipped(cid, title, "no allowed regions given (--region, or a policy)", crit)
    problems: list[str] = []
    placement: dict[str, Any] = {}
    if facts.nodes is not None:
        for w in facts.workloads:
            region = facts.nodes.get(w.node or "", {}).get(label)
            placement[w.name] = {"node": w.node, "region": region}
            if w.node is None:
                problems.append(f"pod {w.name} is not scheduled")
            elif region not in allowed:
                problems.append(f"pod {w.name} runs on node {w.node} in region {region}")
        evidence: dict[str, Any] = {"source": "kubernetes API", "region_label": label,
                                    "nodes": facts.nodes, "pods": placement}
    else:
        for w in facts.workloads:
            placement[w.name] = list(w.affinity_regions or ())
            if w.affinity_regions is None:
                problems.append(f"{w.kind} {w.name} has no required node affinity on {label}")
            elif not set(w.affinity_regions) <= allowed:
                problems.append(f"{w.kind} {w.name} may run in "
                                f"{', '.join(sorted(set(w.affinity_regions) - allowed))}")
        evidence = {"source": "manifests (required node affinity)", "region_label": label,
                    "pods": placement}
    evidence["allowed_regions"] = sorted(allowed)
    evidence["allowed_regions_from"] = allowed_from
    if problems:
        problems.append(f"allowed regions: {', '.join(sorted(allowed))} (from {allowed_from})")
        return CheckResult(cid, title, "fail", "; ".join(problems), evidence, crit)
    return CheckResult(cid, title, "pass", f"all {counted(len(facts.workloads), 'pod')} in "
                       f"{', '.join(sorted(allowed))}", evidence, crit)


def _inside_policy(policy: Any, url: str) -> bool:
    parts = urlsplit(url if "://" in url else "http://" + url)
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    if host is None:
        return False
    for d in policy.destinations.values():
        ep = d.endpoint
        if port not in ep.ports:
            continue
        if ep.hostname == host.lower():
            return True
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            continue
        if any(ip in n for n in ([ep.network] if ep.network else []) + list(ep.resolves_to)):
            return True
    return False


def _redact(value: str) -> str:
    parts = urlsplit(value)
    if parts.password or parts.username:
        return value.replace(parts.netloc, parts.netloc.rsplit("@", 1)[-1])
    return value


def check_env(facts: Facts) -> CheckResult:
    """Telemetry and hub switches set; OTLP endpoints and proxies only inside the policy."""
    cid, title, crit = ("k8s.telemetry-env", "telemetry and hub access off; no OTLP/proxy "
                        "target outside the policy", ("SOV-3", "SOV-4"))
    if facts.workloads is None:
        return skipped(cid, title, "no Helm values, manifests or kubeconfig given", crit)
    problems: list[str] = []
    seen: dict[str, Any] = {}
    for w in facts.workloads:
        if w.labels.get("app.kubernetes.io/component") == "test":
            continue  # the `helm test` pod is not part of the serving path
        for c in w.containers:
            where = f"{w.name}/{c.name}"
            switches = {k: c.env.get(k) for k in TELEMETRY_SWITCHES}
            # vLLM compares VLLM_NO_USAGE_STATS and DO_NOT_TRACK with "1" exactly.
            missing = [k for k, v in switches.items() if v != "1"]
            targets: dict[str, str | None] = {}
            for name, value in c.env.items():
                if not _TARGET_VARS.match(name):
                    continue
                targets[name] = _redact(value) if value is not None else None
                if value is None:
                    problems.append(f"{where}: {name} comes from a reference (not checkable)")
                elif facts.policy is None or not _inside_policy(facts.policy, value):
                    problems.append(f"{where}: {name}={_redact(value)} is not a policy "
                                    "destination")
            if missing:
                problems.append(f"{where}: {', '.join(missing)} not set to 1")
            seen[where] = {"switches": switches, "targets": targets}
    evidence = {"source": facts.workload_source, "containers": seen}
    if problems:
        return CheckResult(cid, title, "fail", "; ".join(problems), evidence, crit)
    return CheckResult(cid, title, "pass", f"{counted(len(seen), 'container')} with all four "
                       "switches on and no outside OTLP/proxy target", evidence, crit)


def check_images(facts: Facts) -> CheckResult:
    """Every image is referenced by digest from an in-region registry."""
    cid, title, crit = ("k8s.images", "images by digest from in-region registries",
                        ("SOV-5",))
    if facts.workloads is None:
        return skipped(cid, title, "no Helm values, manifests or kubeconfig given", crit)
    registries = facts.criteria.registries
    if not registries:
        return skipped(cid, title, "no in-region registries given (--registry)", crit)
    problems: list[str] = []
    images: dict[str, str] = {}
    for w in facts.workloads:
        for c in w.containers:
            images[f"{w.name}/{c.name}"] = c.image
            if not _DIGEST.search(c.image):
                problems.append(f"{w.name}/{c.name}: {c.image} is not pinned by digest")
            if not any(c.image.startswith(r.rstrip("/") + "/") for r in registries):
                problems.append(f"{w.name}/{c.name}: {c.image} is not from "
                                f"{' or '.join(registries)}")
    evidence = {"source": facts.workload_source, "images": images,
                "registries": list(registries)}
    if problems:
        return CheckResult(cid, title, "fail", "; ".join(problems), evidence, crit)
    return CheckResult(cid, title, "pass", f"{counted(len(images), 'image')} by digest from "
                       "in-region registries", evidence, crit)
