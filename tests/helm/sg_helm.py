"""Helpers for the Helm chart tests: run the real helm binary, parse and inspect renders.

The binaries come from ``make tools`` (``.tools/bin/helm``, ``.tools/checkov/bin/checkov``).
A missing tool is a test failure, never a skip: CI runs ``make test``, which installs them.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "sovereign-gateway"
VALUES = Path(__file__).resolve().parent / "values"
GOLDEN = Path(__file__).resolve().parent / "golden"
POLICY_FILE = VALUES / "policy.yaml"
HELM = REPO / ".tools" / "bin" / "helm"
CHECKOV = REPO / ".tools" / "checkov" / "bin" / "checkov"
RELEASE = "sg"
NAMESPACE = "sovereign-ai"
KUBE_VERSION = "1.35.0"

#: Scenario name -> values file (each also gets policy.document from POLICY_FILE).
SCENARIOS = {
    "default": VALUES / "default.yaml",
    "postgres-ha": VALUES / "postgres-ha.yaml",
    "vllm": VALUES / "vllm.yaml",
    "cilium": VALUES / "cilium.yaml",
}

#: Scenario name -> its egress policy (policy.document). Each scenario's egress.destinations is
#: what ``policy networkpolicy <policy> --format helm-values`` prints for it, and every
#: destination its rendered config names is defined there, so ``gateway check-config`` accepts it.
SCENARIO_POLICIES = {
    "default": POLICY_FILE,
    "postgres-ha": VALUES / "policy-postgres-ha.yaml",
    "vllm": VALUES / "policy-vllm.yaml",
    "cilium": VALUES / "policy-cilium.yaml",
}
_POLICY_OF_VALUES = {SCENARIOS[s]: p for s, p in SCENARIO_POLICIES.items()}

#: ``policy=SCENARIO`` (the default): the policy of the first scenario values file given,
#: else POLICY_FILE.
SCENARIO: Literal["scenario"] = "scenario"
PolicyArg = Path | None | Literal["scenario"]

WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


def require_tool(path: Path) -> Path:
    """Return ``path`` if it is an executable tool, else fail the test (never skip)."""
    if not path.is_file():
        pytest.fail(f"{path.relative_to(REPO)} is missing: run `make tools` (CI does)")
    return path


@dataclass(frozen=True)
class HelmResult:
    """Outcome of one helm invocation."""

    returncode: int
    stdout: str
    stderr: str


_TEMPLATE_CACHE: dict[tuple[str, ...], HelmResult] = {}


def _cache_key(args: Sequence[str]) -> tuple[str, ...]:
    """``args`` plus the SHA-256 of every values or --set-file file they name."""
    key = list(args)
    for i, arg in enumerate(args):
        path = None
        if i > 0 and args[i - 1] == "-f":
            path = Path(arg)
        elif i > 0 and args[i - 1] == "--set-file":
            path = Path(arg.split("=", 1)[1])
        if path is not None and path.is_file():
            key.append(hashlib.sha256(path.read_bytes()).hexdigest())
    return tuple(key)


def helm(*args: str, timeout_s: float = 120.0) -> HelmResult:
    """Run the real helm binary with ``args`` (no network use: template and lint only).

    ``helm template`` results are memoised per process on the arguments and the contents of
    the files they name (the chart does not change during a test run): the suite renders the
    same scenarios many times on a 2-core machine.
    """
    if args and args[0] == "template":
        key = _cache_key(args)
        if key not in _TEMPLATE_CACHE:
            _TEMPLATE_CACHE[key] = run_helm(args, timeout_s)
        return _TEMPLATE_CACHE[key]
    return run_helm(args, timeout_s)


def run_helm(args: Sequence[str], timeout_s: float = 120.0) -> HelmResult:
    """Run helm once, without memoisation."""
    proc = subprocess.run(
        [str(require_tool(HELM)), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(REPO / ".tools"), "HELM_CACHE_HOME":
             str(REPO / ".tools" / "helm-cache"), "HELM_CONFIG_HOME": str(REPO / ".tools" /
             "helm-config"), "HELM_DATA_HOME": str(REPO / ".tools" / "helm-data")},
    )
    return HelmResult(proc.returncode, proc.stdout, proc.stderr)


def policy_for(values: Sequence[Path]) -> Path:
    """The egress policy of the first scenario values file in ``values`` (else POLICY_FILE)."""
    for v in values:
        if v in _POLICY_OF_VALUES:
            return _POLICY_OF_VALUES[v]
    return POLICY_FILE


def template_args(
    values: Sequence[Path] = (),
    sets: Mapping[str, str] | None = None,
    set_files: Mapping[str, Path] | None = None,
    policy: PolicyArg = SCENARIO,
) -> list[str]:
    """Arguments of ``helm template`` for the chart with the given values.

    ``policy`` is the policy.document file: SCENARIO picks the scenario's own policy
    (:func:`policy_for`), None sets none.
    """
    if policy == SCENARIO:
        policy = policy_for(values)
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--kube-version", KUBE_VERSION]
    for v in values:
        args += ["-f", str(v)]
    if policy is not None:
        args += ["--set-file", f"policy.document={policy}"]
    for key, path in (set_files or {}).items():
        args += ["--set-file", f"{key}={path}"]
    for key, value in (sets or {}).items():
        args += ["--set", f"{key}={value}"]
    return args


def render_text(*values: Path, sets: Mapping[str, str] | None = None,
                policy: PolicyArg = SCENARIO) -> str:
    """Render the chart and return the manifest text; fail the test if helm refuses."""
    res = helm(*template_args(values, sets, policy=policy))
    if res.returncode != 0:
        pytest.fail(f"helm template failed:\n{res.stderr}")
    return res.stdout


def render(*values: Path, sets: Mapping[str, str] | None = None,
           policy: PolicyArg = SCENARIO) -> list[dict[str, Any]]:
    """Render the chart and return its objects (empty documents dropped)."""
    return parse(render_text(*values, sets=sets, policy=policy))


def refuse(*values: Path, sets: Mapping[str, str] | None = None,
           policy: PolicyArg = SCENARIO) -> str:
    """Render and expect helm to refuse; return its error output."""
    res = helm(*template_args(values, sets, policy=policy))
    assert res.returncode != 0, "helm rendered values that must be refused"
    assert res.stdout.strip() == "", "a refused render must not print manifests"
    return res.stderr


def parse(text: str) -> list[dict[str, Any]]:
    """Parse a multi-document manifest stream."""
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(objs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: Iterable[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


PodView = tuple[str, dict[str, Any], dict[str, Any]]


def pod_specs(objs: Iterable[dict[str, Any]]) -> Iterator[PodView]:
    """Yield (object name, pod labels, pod spec) for every workload and bare Pod."""
    for o in objs:
        if o["kind"] in WORKLOAD_KINDS:
            tpl = o["spec"]["template"]
            yield f'{o["kind"]}/{o["metadata"]["name"]}', tpl["metadata"]["labels"], tpl["spec"]
        elif o["kind"] == "Pod":
            yield f'Pod/{o["metadata"]["name"]}', o["metadata"]["labels"], o["spec"]


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Kubernetes LabelSelector semantics (matchLabels and matchExpressions)."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, vals = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in vals:
            return False
        if op == "NotIn" and labels.get(key) in vals:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
