"""Inputs of the pre-flight, and the facts collected from them (each input optional).

:class:`Inputs` names what the operator gives; :func:`collect` reads each given input once
into :class:`Facts` (a missing input leaves its fact ``None``, and the checks that need it
are skipped). Nothing is contacted except the inputs given: the admin URL, the kubeconfig's
API server, and local files; ``helm template`` runs offline.

Workloads from rendered manifests and from the API are normalised to :class:`Workload` so the
cluster checks do not care where they came from.
"""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from clishell import read_input_text
from gateway.preflight.errors import PreflightInputError

__all__ = ["Container", "Criteria", "Facts", "Inputs", "Workload", "collect", "render_helm"]

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet")
REGION_LABEL = "topology.kubernetes.io/region"


@dataclass(frozen=True, slots=True)
class Criteria:
    """What the operator accepts (the yardstick of the checks).

    Attributes:
        regions: Allowed regions (policy destinations and node labels).
        jurisdictions: Allowed jurisdictions of policy destinations (e.g. ``EU``).
        registries: In-region image registries (``registry.example.eu`` or a path prefix).
        retention_days: Declared retention of the audit log, days (``None``: not declared).
        region_label: Node label carrying the region.
        require_identity: Callers must be identified by token or client certificate (the
            ``identity.configured`` check runs; also when the config says ``identity.required``).
    """

    regions: tuple[str, ...] = ()
    jurisdictions: tuple[str, ...] = ("EU",)
    registries: tuple[str, ...] = ()
    retention_days: int | None = None
    region_label: str = REGION_LABEL
    require_identity: bool = False


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the pre-flight may read (each optional).

    Attributes:
        config: Gateway config file (its ``policy.file`` is used unless ``policy`` is given).
        policy: Egress policy file.
        values: Helm values files (rendered with ``helm template`` and ``chart``).
        chart: Chart directory for ``values``.
        manifests: Already rendered manifests (multi-document YAML), instead of values.
        helm: The helm binary.
        release: Helm release name (pod label ``app.kubernetes.io/instance``).
        namespace: Release namespace.
        admin_url: Base URL of a running gateway's admin port (``GET /status``).
        kubeconfig: Kubeconfig of the cluster (read-only API use).
        kube_context: Context of the kubeconfig (default: current).
        audit_public_key: Verifier key of the audit log (``gateway audit keygen`` KEY.pub).
        lockfile: ``weights.lock``.
        weights_dir: Weights in use (directory or HF cache).
        weights_signature: model_signing signature of ``weights_dir``.
        weights_public_key: Public key of that signature (PEM).
    """

    config: Path | None = None
    policy: Path | None = None
    values: tuple[Path, ...] = ()
    chart: Path | None = None
    manifests: Path | None = None
    helm: Path | None = None
    release: str = "sg"
    namespace: str = "default"
    admin_url: str | None = None
    kubeconfig: Path | None = None
    kube_context: str | None = None
    audit_public_key: Path | None = None
    lockfile: Path | None = None
    weights_dir: Path | None = None
    weights_signature: Path | None = None
    weights_public_key: Path | None = None

    def describe(self) -> dict[str, Any]:
        """The inputs as strings for the report (no credentials: URLs and paths only)."""
        out = {k: (str(v) if isinstance(v, Path) else [str(p) for p in v]
                   if isinstance(v, tuple) else v)
               for k, v in ((f, getattr(self, f)) for f in self.__dataclass_fields__)}
        if self.admin_url:
            parts = urlsplit(self.admin_url)
            out["admin_url"] = parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]).geturl()
        return out


@dataclass(frozen=True, slots=True)
class Container:
    """A container of a workload: image and environment (``None``: from a Secret/ref)."""

    name: str
    image: str
    env: dict[str, str | None]


@dataclass(frozen=True, slots=True)
class Workload:
    """A pod (API) or pod template (manifests) of the release.

    Attributes:
        kind: ``Pod`` or the owning workload kind.
        name: Object name.
        labels: Pod labels.
        containers: Containers and init containers.
        node: Node name (API pods only).
        affinity_regions: Regions of a required node affinity on the region label, or
            ``None`` when there is none.
        volumes: The pod's volumes as written.
        mounts: ``{volume name: [mount paths]}`` over all containers.
    """

    kind: str
    name: str
    labels: dict[str, str]
    containers: tuple[Container, ...]
    node: str | None
    affinity_regions: tuple[str, ...] | None
    volumes: tuple[dict[str, Any], ...]
    mounts: dict[str, list[str]]


@dataclass
class Facts:
    """What was read (``None``: input not given). Filled by :func:`collect`."""

    inputs: Inputs
    criteria: Criteria
    policy: Any = None
    settings: Any = None
    config_sha256: str | None = None
    values_text: str | None = None
    manifests: list[dict[str, Any]] | None = None
    workloads: list[Workload] | None = None
    workload_source: str | None = None
    networkpolicies: list[dict[str, Any]] | None = None
    nodes: dict[str, dict[str, str]] | None = None
    status: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def _pod_spec_workload(kind: str, name: str, labels: Any, spec: Any, node: str | None,
                       region_label: str) -> Workload:
    spec = spec if isinstance(spec, dict) else {}
    containers: list[Container] = []
    mounts: dict[str, list[str]] = {}
    for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        env: dict[str, str | None] = {}
        for e in c.get("env") or ():
            env[str(e.get("name"))] = str(e["value"]) if "value" in e else None
        containers.append(Container(str(c.get("name")), str(c.get("image", "")), env))
        for m in c.get("volumeMounts") or ():
            mounts.setdefault(str(m.get("name")), []).append(str(m.get("mountPath")))
    regions: tuple[str, ...] | None = None
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
                 "nodeSelectorTerms") or ()
    for term in terms:
        for expr in term.get("matchExpressions") or ():
            if expr.get("key") == region_label and expr.get("operator") == "In":
                regions = (*(regions or ()), *map(str, expr.get("values") or ()))
    selector = (spec.get("nodeSelector") or {}).get(region_label)
    if isinstance(selector, str):
        regions = (*(regions or ()), selector)
    return Workload(kind, name, {str(k): str(v) for k, v in (labels or {}).items()},
                    tuple(containers), node, regions, tuple(spec.get("volumes") or ()), mounts)


def workloads_from_manifests(docs: list[dict[str, Any]], region_label: str) -> list[Workload]:
    """Pod templates of the rendered workloads (``helm template`` output)."""
    out = []
    for d in docs:
        if d.get("kind") in WORKLOAD_KINDS:
            tmpl = (d.get("spec") or {}).get("template") or {}
            out.append(_pod_spec_workload(
                str(d["kind"]), str((d.get("metadata") or {}).get("name")),
                (tmpl.get("metadata") or {}).get("labels"), tmpl.get("spec"), None, region_label))
        elif d.get("kind") == "Pod":
            meta = d.get("metadata") or {}
            out.append(_pod_spec_workload("Pod", str(meta.get("name")), meta.get("labels"),
                                          d.get("spec"), None, region_label))
    return out


def render_helm(inputs: Inputs, policy_path: Path | None) -> str:
    """Run ``helm template`` offline on the chart with the values files.

    Raises:
        PreflightInputError: No chart or helm binary, or helm failed (its stderr is shown).
    """
    if inputs.chart is None or inputs.helm is None:
        raise PreflightInputError("--values needs --chart and a helm binary (--helm)")
    args = [str(inputs.helm), "template", inputs.release, str(inputs.chart),
            "--namespace", inputs.namespace]
    for v in inputs.values:
        args += ["-f", str(v)]
    if policy_path is not None:
        args += ["--set-file", f"policy.document={policy_path}"]
    try:
        # A fresh, empty helm home: no repositories, plugins or registry credentials.
        with tempfile.TemporaryDirectory(prefix="sg-preflight-helm.") as tmp:
            home = Path(tmp)
            env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "HELM_CACHE_HOME": str(home / "c"),
                   "HELM_CONFIG_HOME": str(home / "g"), "HELM_DATA_HOME": str(home / "d")}
            proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env,
                                  check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PreflightInputError(f"cannot run helm {inputs.helm}: {exc}") from exc
    if proc.returncode != 0:
        raise PreflightInputError(f"helm template failed: {proc.stderr.strip()[:500]}")
    return proc.stdout


def _yaml_docs(text: str, source: str) -> list[dict[str, Any]]:
    try:
        return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    except yaml.YAMLError as exc:
        raise PreflightInputError(f"{source}: not valid YAML: {exc}") from exc


def fetch_status(admin_url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """``GET {admin_url}/status`` of a running gateway (no proxy, no redirects).

    Raises:
        PreflightInputError: Unreachable, non-200 or not a JSON object.
    """
    import httpx

    try:
        with httpx.Client(trust_env=False, follow_redirects=False, timeout=timeout_s) as c:
            resp = c.get(admin_url.rstrip("/") + "/status")
    except httpx.HTTPError as exc:
        raise PreflightInputError(f"admin port {admin_url}: {exc}") from exc
    if resp.status_code != 200:
        raise PreflightInputError(f"admin port {admin_url}/status: HTTP {resp.status_code} "
                                  "(a gateway without telemetry.admin has no admin port)")
    body = resp.json()
    if not isinstance(body, dict):
        raise PreflightInputError(f"admin port {admin_url}/status: not a JSON object")
    return body


def _load_config(inputs: Inputs, facts: Facts) -> None:
    """Validate the gateway config without its secrets.

    Backend credentials (``api_key_env``/``api_key_file``) are dropped before validation: the
    pre-flight needs none of them, so it never reads them and they cannot reach a report.
    """
    from gateway.config.loader import parse
    from gateway.errors import ConfigError

    assert inputs.config is not None
    text = _read(inputs.config)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PreflightInputError(f"config {inputs.config}: not valid YAML: {exc}") from exc
    models = data.get("models") if isinstance(data, dict) else None
    for model in models if isinstance(models, list) else ():
        for replica in (model.get("replicas") or ()) if isinstance(model, dict) else ():
            if isinstance(replica, dict):
                for key in ("api_key", "api_key_env", "api_key_file"):
                    replica.pop(key, None)
    try:
        facts.settings = parse(data, {}, inputs.config.parent)
    except ConfigError as exc:
        raise PreflightInputError(f"config {inputs.config}: {exc.message}") from exc
    facts.config_sha256 = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _policy_path(inputs: Inputs, facts: Facts) -> Path | None:
    if inputs.policy is not None:
        return inputs.policy
    section = getattr(facts.settings, "policy", None) if facts.settings is not None else None
    if section is None:
        return None
    p = Path(section["file"] if isinstance(section, dict) else section.file)
    return p if p.is_absolute() or inputs.config is None else inputs.config.parent / p


def collect(inputs: Inputs, criteria: Criteria) -> Facts:
    """Read every given input once.

    Raises:
        PreflightInputError: A given input cannot be read or used (the run exits 2).
    """
    from policy import Policy, PolicyError

    for name in ("config", "policy", "manifests", "kubeconfig", "audit_public_key", "lockfile",
                 "weights_dir", "weights_signature", "weights_public_key"):
        path = getattr(inputs, name)
        if path is not None and not Path(path).exists():
            raise PreflightInputError(f"--{name.replace('_', '-')} {path}: no such file")
    for v in inputs.values:
        if not v.is_file():
            raise PreflightInputError(f"--values {v}: no such file")
    facts = Facts(inputs, criteria)
    if inputs.config is not None:
        _load_config(inputs, facts)
    policy_path = _policy_path(inputs, facts)
    if policy_path is not None:
        try:
            facts.policy = Policy.from_file(policy_path)
        except PolicyError as exc:
            raise PreflightInputError(f"policy: {exc}") from exc
    if inputs.manifests is not None or inputs.values:
        if inputs.manifests is not None:
            text = _read(inputs.manifests)
        else:
            text = render_helm(inputs, policy_path)
            facts.values_text = "\n".join(_read(v) for v in inputs.values)
        facts.manifests = _yaml_docs(text, str(inputs.manifests or "helm template"))
        facts.workloads = workloads_from_manifests(facts.manifests, criteria.region_label)
        facts.workload_source = "manifests"
        facts.networkpolicies = [d for d in facts.manifests if d.get("kind") == "NetworkPolicy"]
    if inputs.kubeconfig is not None:
        _collect_kube(inputs, criteria, facts)
    if inputs.admin_url is not None:
        facts.status = fetch_status(inputs.admin_url)
    return facts


def _collect_kube(inputs: Inputs, criteria: Criteria, facts: Facts) -> None:
    from gateway.preflight.kube import KubeClient, load_kubeconfig

    assert inputs.kubeconfig is not None
    with KubeClient(load_kubeconfig(inputs.kubeconfig, inputs.kube_context)) as kube:
        state = kube.release_state(inputs.namespace, inputs.release)
    facts.workloads = [
        _pod_spec_workload("Pod", str((p.get("metadata") or {}).get("name")),
                           (p.get("metadata") or {}).get("labels"), p.get("spec"),
                           (p.get("spec") or {}).get("nodeName"), criteria.region_label)
        for p in state["pods"]
    ]
    facts.workload_source = "kubernetes API"
    facts.networkpolicies = state["networkpolicies"]
    facts.nodes = {name: {str(k): str(v) for k, v in
                          ((node.get("metadata") or {}).get("labels") or {}).items()}
                   for name, node in state["nodes"].items()}


def _read(path: Path) -> str:
    try:
        return read_input_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise PreflightInputError(f"cannot read {path}: {exc}") from exc


def run_async(coro: Any) -> Any:
    """Run a coroutine from synchronous code (the CLI has no loop running)."""
    return asyncio.run(coro)
