"""Security properties of the rendered objects, checked on every scenario.

* every pod is selected by a default-deny policy for ingress and egress;
* the gateway's allowed egress is exactly: the policy's destinations, DNS, the audit database
  and the telemetry collector (plus the in-chart vLLM pods), each with explicit ports;
* every container is hardened; secrets reach the gateway as files, never environment variables;
* every pod is pinned to the allowed regions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sg_helm as h
import yaml

GATEWAY_LABELS = {"app.kubernetes.io/name": "sovereign-gateway",
                  "app.kubernetes.io/instance": h.RELEASE,
                  "app.kubernetes.io/component": "gateway"}
DNS_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}


def _values(scenario: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(h.SCENARIOS[scenario].read_text(encoding="utf-8"))
    return data


def _policies_selecting(objs: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    return [p for p in h.by_kind(objs, "NetworkPolicy")
            if h.selects(p["spec"]["podSelector"], labels)]


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_every_pod_is_under_default_deny(scenario: str) -> None:
    objs = h.render(h.SCENARIOS[scenario])
    pods = list(h.pod_specs(objs))
    assert len(pods) >= 2  # the gateway and the helm test pod at least
    for name, labels, _spec in pods:
        policies = _policies_selecting(objs, labels)
        deny_egress = [p for p in policies if "Egress" in p["spec"]["policyTypes"]
                       and not p["spec"].get("egress")]
        deny_ingress = [p for p in policies if "Ingress" in p["spec"]["policyTypes"]
                        and not p["spec"].get("ingress")]
        assert deny_egress, f"{name} is not selected by a default-deny egress policy"
        assert deny_ingress, f"{name} is not selected by a default-deny ingress policy"


def _gateway_egress(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for p in _policies_selecting(objs, GATEWAY_LABELS):
        if "Egress" in p["spec"]["policyTypes"]:
            rules.extend(p["spec"].get("egress") or [])
    return rules


@pytest.mark.parametrize("scenario", ["default", "postgres-ha", "vllm"])
def test_gateway_egress_is_exactly_policy_dns_database_collector(scenario: str) -> None:
    values = _values(scenario)
    objs = h.render(h.SCENARIOS[scenario])
    rules = _gateway_egress(objs)

    expected: set[tuple[str, int, str]] = set()
    for dest in values["egress"]["destinations"]:
        for cidr in dest["cidrs"]:
            for port in dest["ports"]:
                expected.add((cidr, port["port"], port.get("protocol", "TCP")))
    audit = values["audit"].get("store", {})
    if audit.get("type") == "postgresql":
        for cidr in audit["postgresql"]["cidrs"]:
            expected.add((cidr, audit["postgresql"]["port"], "TCP"))
    telemetry = values.get("telemetry", {})
    if telemetry.get("enabled"):
        for cidr in telemetry["cidrs"]:
            expected.add((cidr, telemetry["port"], "TCP"))

    allowed: set[tuple[str, int, str]] = set()
    dns_rules = 0
    pod_rules: list[dict[str, Any]] = []
    for rule in rules:
        # A rule without `to` or without `ports` would allow every address or every port.
        assert rule.get("to"), f"egress rule without peers allows any destination: {rule}"
        assert rule.get("ports"), f"egress rule without ports allows any port: {rule}"
        peers = rule["to"]
        if peers == [DNS_PEER]:
            dns_rules += 1
            assert sorted((p["port"], p["protocol"]) for p in rule["ports"]) == [
                (53, "TCP"), (53, "UDP")]
            continue
        for peer in peers:
            if "ipBlock" in peer:
                assert "except" not in peer["ipBlock"]
                for port in rule["ports"]:
                    allowed.add((peer["ipBlock"]["cidr"], port["port"], port["protocol"]))
            else:
                pod_rules.append(peer)
    assert dns_rules == 1
    assert allowed == expected
    if values.get("vllm", {}).get("enabled"):
        assert pod_rules == [{"podSelector": {"matchLabels": {
            "app.kubernetes.io/name": "sovereign-gateway", "app.kubernetes.io/instance": h.RELEASE,
            "app.kubernetes.io/component": "vllm"}}}]
    else:
        assert pod_rules == []


def test_cilium_variant_uses_to_fqdns_for_hostname_destinations() -> None:
    values = _values("cilium")
    objs = h.render(h.SCENARIOS["cilium"])
    assert not [p for p in _policies_selecting(objs, GATEWAY_LABELS)
                if "Egress" in p["spec"]["policyTypes"] and p["spec"].get("egress")]
    (cnp,) = h.by_kind(objs, "CiliumNetworkPolicy")
    assert h.selects(cnp["spec"]["endpointSelector"], GATEWAY_LABELS)
    egress = cnp["spec"]["egress"]
    fqdns = {r["toFQDNs"][0]["matchName"]: r["toPorts"][0]["ports"] for r in egress
             if "toFQDNs" in r}
    cidrs = {c: r["toPorts"][0]["ports"] for r in egress if "toCIDR" in r for c in r["toCIDR"]}
    want_fqdns = {d["fqdn"]: [{"port": str(p["port"]), "protocol": p["protocol"]}
                              for p in d["ports"]]
                  for d in values["egress"]["destinations"] if d["fqdn"]}
    want_cidrs = {c: [{"port": str(p["port"]), "protocol": p["protocol"]} for p in d["ports"]]
                  for d in values["egress"]["destinations"] for c in d["cidrs"]}
    assert fqdns == want_fqdns
    assert cidrs == want_cidrs
    dns = [r for r in egress if "toEndpoints" in r and r["toPorts"][0].get("rules")]
    assert len(dns) == 1
    assert dns[0]["toEndpoints"] == [{"matchLabels": {
        "k8s:io.kubernetes.pod.namespace": "kube-system", "k8s-app": "kube-dns"}}]
    for rule in egress:
        assert "toEntities" not in rule and "toPorts" in rule


def test_hostname_only_destination_is_refused_without_cilium(tmp_path: Path) -> None:
    extra = tmp_path / "fqdn.yaml"
    extra.write_text(yaml.safe_dump({"egress": {"destinations": [
        {"id": "mistral-eu", "cidrs": [], "ports": [{"port": 443, "protocol": "TCP"}],
         "fqdn": "api.mistral.example.eu"}]}}), encoding="utf-8")
    err = h.refuse(h.SCENARIOS["default"], extra)
    assert 'egress destination "mistral-eu" has only a hostname (api.mistral.example.eu)' in err
    assert "networkPolicy.flavor=cilium" in err


def _container_hardened(name: str, pod: dict[str, Any], c: dict[str, Any]) -> None:
    psc = pod.get("securityContext", {})
    sc = c.get("securityContext", {})
    where = f"{name}/{c['name']}"
    assert sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, where
    assert sc.get("runAsUser", psc.get("runAsUser", 0)) >= 10000, where
    assert sc.get("readOnlyRootFilesystem") is True, where
    assert sc.get("allowPrivilegeEscalation") is False, where
    assert sc.get("privileged", False) is False, where
    assert "ALL" in sc.get("capabilities", {}).get("drop", []), where
    assert not sc.get("capabilities", {}).get("add"), where
    seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {}))
    assert seccomp.get("type") == "RuntimeDefault", where
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c.get("resources", {}).get(kind, {})), f"{where} {kind}"
    tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]  # noqa: S108
    if sc.get("readOnlyRootFilesystem") and c["name"] != "readyz-and-models":
        assert tmp, f"{where}: no writable /tmp"
        vol = next(v for v in pod["volumes"] if v["name"] == tmp[0]["name"])
        assert "emptyDir" in vol, where


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_every_container_is_hardened_and_region_pinned(scenario: str) -> None:
    values = _values(scenario)
    sov = values.get("sovereignty", {})
    regions = sov.get("allowedRegions", ["eu-central-1"]) + [
        r["name"] for r in sov.get("additionalRegions", [])]
    objs = h.render(h.SCENARIOS[scenario])
    for name, _labels, pod in h.pod_specs(objs):
        assert pod["automountServiceAccountToken"] is False, name
        for host_ns in ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace"):
            assert not pod.get(host_ns), f"{name}: {host_ns}"
        assert not [v for v in pod.get("volumes", []) if "hostPath" in v], name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        for c in pod["containers"] + pod.get("initContainers", []):
            _container_hardened(name, pod, c)
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"] == [{"matchExpressions": [{
            "key": "topology.kubernetes.io/region", "operator": "In", "values": regions}]}], name


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_gateway_reads_secrets_from_files_only(scenario: str) -> None:
    objs = h.render(h.SCENARIOS[scenario])
    deploy = h.one(objs, "Deployment", "sg-sovereign-gateway")
    pod = deploy["spec"]["template"]["spec"]
    (gw,) = pod["containers"]
    for env in gw.get("env", []):
        assert "valueFrom" not in env, f"gateway env {env['name']} comes from a Secret"
    assert "envFrom" not in gw
    config = yaml.safe_load(h.one(objs, "ConfigMap", "sg-sovereign-gateway-config")
                            ["data"]["config.yaml"])
    files = [config["audit"]["signing_key_file"]]
    files += [config[k] for k in ("keys_file",) if k in config]
    files += [config["audit"][k] for k in ("store_file", "pseudonym_key_file")
              if k in config["audit"]]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in files:
        mounts = [m for m in gw["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        assert len(mounts) == 1, f"{path} is not on exactly one mount"
        assert mounts[0]["readOnly"] is True
        secret = volumes[mounts[0]["name"]]["secret"]
        assert secret["defaultMode"] == 0o400
        assert secret["items"][0]["path"] == path.rsplit("/", 1)[1]


def test_config_or_policy_change_rolls_the_pods(tmp_path: Path) -> None:
    def annotations(*extra: Path, policy: Path = h.POLICY_FILE) -> dict[str, str]:
        objs = h.render(h.SCENARIOS["default"], *extra, policy=policy)
        ann: dict[str, str] = h.one(objs, "Deployment", "sg-sovereign-gateway")[
            "spec"]["template"]["metadata"]["annotations"]
        return ann

    base = annotations()
    changed_config = tmp_path / "limits.yaml"
    changed_config.write_text("gateway:\n  limits:\n    max_body_bytes: 1024\n", encoding="utf-8")
    assert annotations(changed_config)["checksum/config"] != base["checksum/config"]
    policy = tmp_path / "policy.yaml"
    policy.write_text(h.POLICY_FILE.read_text(encoding="utf-8") + "# changed\n", encoding="utf-8")
    assert annotations(policy=policy)["checksum/config"] != base["checksum/config"]
    assert annotations()["checksum/config"] == base["checksum/config"]
    egress = tmp_path / "egress.yaml"
    egress.write_text(yaml.safe_dump({"egress": {"destinations": [
        {"id": "model-mirror", "cidrs": ["10.30.1.0/29"], "ports": [{"port": 443,
         "protocol": "TCP"}], "fqdn": "mirror.models.internal.example"},
        {"id": "vllm-external", "cidrs": ["10.20.0.0/24"], "ports": [{"port": 8000,
         "protocol": "TCP"}], "fqdn": None}]}}), encoding="utf-8")
    assert annotations(egress)["checksum/egress"] != base["checksum/egress"]


def test_several_replicas_get_postgres_rolling_update_and_pdb() -> None:
    objs = h.render(h.SCENARIOS["postgres-ha"])
    deploy = h.one(objs, "Deployment", "sg-sovereign-gateway")
    assert deploy["spec"]["replicas"] == 3
    assert deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    assert not h.by_kind(objs, "PersistentVolumeClaim")[0]["metadata"]["name"].endswith("-audit")
    assert h.one(objs, "PodDisruptionBudget", "sg-sovereign-gateway")["spec"]["minAvailable"] == 1
    spread = deploy["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread[0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert spread[0]["whenUnsatisfiable"] == "DoNotSchedule"
    image = deploy["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.endswith("@sha256:" + "0123456789abcdef" * 4) and ":0.1.0" not in image


def test_single_replica_keeps_sqlite_on_a_retained_pvc() -> None:
    objs = h.render(h.SCENARIOS["default"])
    deploy = h.one(objs, "Deployment", "sg-sovereign-gateway")
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    pvc = h.one(objs, "PersistentVolumeClaim", "sg-sovereign-gateway-audit")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert h.one(objs, "PersistentVolumeClaim", "sg-sovereign-gateway-checkpoints")
    assert not h.by_kind(objs, "PodDisruptionBudget")
    assert not h.by_kind(objs, "HorizontalPodAutoscaler")


@pytest.mark.parametrize("kind", ["ConfigMap", "Secret"])
def test_existing_config_object_replaces_the_rendered_one(tmp_path: Path, kind: str) -> None:
    extra = tmp_path / "existing.yaml"
    key = "existingConfigMap" if kind == "ConfigMap" else "existingConfigSecret"
    extra.write_text(yaml.safe_dump({"gateway": {key: "ops-gateway-config",
                                                 "models": []}}), encoding="utf-8")
    objs = h.render(h.SCENARIOS["default"], extra, policy=None)
    assert not h.by_kind(objs, "ConfigMap")
    pod = h.one(objs, "Deployment", "sg-sovereign-gateway")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    if kind == "Secret":
        assert volume["secret"]["secretName"] == "ops-gateway-config"
    else:
        assert volume["configMap"]["name"] == "ops-gateway-config"
    both = tmp_path / "both.yaml"
    both.write_text(yaml.safe_dump({"gateway": {"existingConfigMap": "a",
                                                "existingConfigSecret": "b"}}), encoding="utf-8")
    assert "not both" in h.refuse(h.SCENARIOS["default"], both)


def test_autoscaling_with_postgres_renders_hpa_and_no_fixed_replicas(tmp_path: Path) -> None:
    extra = tmp_path / "hpa.yaml"
    extra.write_text(yaml.safe_dump({"autoscaling": {"enabled": True, "minReplicas": 3,
                                                     "maxReplicas": 9}}), encoding="utf-8")
    objs = h.render(h.SCENARIOS["postgres-ha"], extra)
    deploy = h.one(objs, "Deployment", "sg-sovereign-gateway")
    assert "replicas" not in deploy["spec"]
    hpa = h.one(objs, "HorizontalPodAutoscaler", "sg-sovereign-gateway")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": "sg-sovereign-gateway"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 9)
    assert h.one(objs, "PodDisruptionBudget", "sg-sovereign-gateway")
    monitor = h.one(objs, "ServiceMonitor", "sg-sovereign-gateway")
    assert monitor["spec"]["endpoints"] == [{"port": "admin", "path": "/metrics",
                                             "interval": "30s"}]
    service = h.one(objs, "Service", "sg-sovereign-gateway")
    assert h.selects(monitor["spec"]["selector"], service["metadata"]["labels"])


def test_vllm_backends_run_offline_pinned_and_sized() -> None:
    values = _values("vllm")
    objs = h.render(h.SCENARIOS["vllm"])
    for model in values["vllm"]["models"]:
        kind = model.get("kind", "Deployment")
        name = f"sg-sovereign-gateway-vllm-{model['name']}"
        pod = h.one(objs, kind, name)["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HUB_CACHE"] == "/models/hub"
        assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1"
        args = c["args"]
        assert args[args.index("--revision") + 1] == model["revision"]
        assert args[args.index("--model") + 1] == model["servedModelName"]
        tp = model.get("tensorParallelSize", 1)
        assert args[args.index("--tensor-parallel-size") + 1] == str(tp)
        assert c["resources"]["limits"]["nvidia.com/gpu"] == tp
        assert c["resources"]["requests"]["nvidia.com/gpu"] == tp
        (models_mount,) = [m for m in c["volumeMounts"] if m["name"] == "models"]
        assert models_mount["readOnly"] is True and models_mount["mountPath"] == "/models/hub"
        (store,) = [v for v in pod["volumes"] if v["name"] == "models"]
        assert store["persistentVolumeClaim"] == {"claimName": model["storeClaim"],
                                                  "readOnly": True}
        service = h.one(objs, "Service", name)
        assert h.selects({"matchLabels": service["spec"]["selector"]},
                         h.one(objs, kind, name)["spec"]["template"]["metadata"]["labels"])
    # vLLM pods: reachable from the gateway only, and no egress rule at all.
    vllm_labels = {"app.kubernetes.io/name": "sovereign-gateway",
                   "app.kubernetes.io/instance": h.RELEASE, "app.kubernetes.io/component": "vllm"}
    policies = _policies_selecting(objs, vllm_labels)
    assert not [p for p in policies if p["spec"].get("egress")]
    ingress = [r for p in policies for r in p["spec"].get("ingress") or []]
    assert ingress == [{"from": [{"podSelector": {"matchLabels": GATEWAY_LABELS}}],
                        "ports": [{"port": 8000, "protocol": "TCP"}]}]
