"""The shipped ``examples/values-*.yaml`` render and pass the pre-flight, as their headers say.

Each file's header prints the ``helm template`` and ``gateway preflight`` command lines to run
from the checkout; this test runs exactly those lines (real helm from ``.tools/bin``, the real
pre-flight) and requires exit 0. Its ``egress`` section must be what ``policy networkpolicy``
prints for the policy it deploys, so the two cannot drift apart.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import sg_helm as h
import sg_pod_files as pf
import yaml

EXAMPLES = sorted((h.REPO / "examples").glob("values-*.yaml"))


def _header_commands(path: Path) -> list[list[str]]:
    """The command lines in the file's header comment (``#   cmd \\`` continued lines)."""
    commands: list[list[str]] = []
    current = ""
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        body = line[1:].strip()
        if line.startswith("#   ") and (current or body.startswith((".tools/", "gateway "))):
            current += " " + body.removesuffix("\\").strip()
            if not body.endswith("\\"):
                commands.append(shlex.split(current))
                current = ""
    return commands


def test_there_are_examples() -> None:
    assert EXAMPLES, "examples/values-*.yaml missing"


@pytest.mark.parametrize("values", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_values_render_and_pass_the_preflight_as_printed(values: Path) -> None:
    h.require_tool(h.HELM)
    commands = _header_commands(values)
    assert [c[0] for c in commands] == [".tools/bin/helm", "gateway"], commands
    env = {**os.environ, "PYTHONPATH": str(h.REPO)}
    for argv in commands:
        if argv[0] == "gateway":
            argv = [sys.executable, "-m", "gateway.cli", *argv[1:]]
        run = subprocess.run(argv, cwd=h.REPO, env=env, capture_output=True, text=True,
                             timeout=180, check=False)
        assert run.returncode == 0, f"{shlex.join(argv)}:\n{run.stdout}\n{run.stderr}"


@pytest.mark.parametrize("values", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_egress_is_what_the_policy_renders(values: Path) -> None:
    (helm,) = [c for c in _header_commands(values) if c[0] == ".tools/bin/helm"]
    policy = next(a.split("=", 1)[1] for a in helm if a.startswith("policy.document="))
    rendered = subprocess.run(
        [sys.executable, "-m", "policy.cli", "networkpolicy", policy, "--format", "helm-values"],
        cwd=h.REPO, env={**os.environ, "PYTHONPATH": str(h.REPO)}, capture_output=True,
        text=True, timeout=60, check=True).stdout
    assert yaml.safe_load(values.read_text())["egress"] == yaml.safe_load(rendered)["egress"]


@pytest.mark.parametrize("values", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_config_is_accepted_in_the_pod_with_replicas_from_the_policy(
    values: Path, tmp_path: Path,
) -> None:
    """The rendered config, in the pod's mounts, passes the real ``gateway check-config``; its
    replicas, which name only their destination, are served at the policy's urls."""
    (helm,) = [c for c in _header_commands(values) if c[0] == ".tools/bin/helm"]
    policy = h.REPO / next(a.split("=", 1)[1] for a in helm
                           if a.startswith("policy.document="))
    pod = pf.materialize(h.render(values, policy=policy), tmp_path)
    code, out = pf.check_config(pod.config_file)
    assert code == 0, out
    dests = {d["id"]: d.get("url") for d in yaml.safe_load(policy.read_text())["destinations"]}
    for model in yaml.safe_load(values.read_text())["gateway"]["models"]:
        expected = [r.get("url") or dests[r["destination"]] for r in model["replicas"]]
        assert out["models"][model["name"]]["replicas"] == expected


def _preflight(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "preflight", *argv, "--json"],
                          cwd=h.REPO, env={**os.environ, "PYTHONPATH": str(h.REPO)},
                          capture_output=True, text=True, timeout=180, check=False)


def _node_regions(run: subprocess.CompletedProcess[str]) -> dict[str, object]:
    import json

    checks = {c["id"]: c for c in json.loads(run.stdout)["checks"]}
    return checks["k8s.node-regions"]


def test_preflight_takes_the_regions_from_the_policy_when_none_are_given(tmp_path: Path) -> None:
    """One region model: without --region the node-regions check uses the policy's regions
    (it was skipped), so the chart's default region is flagged against the example policy
    and the example values pass."""
    helm = ["--helm", str(h.HELM), "--chart", str(h.CHART)]
    policy = str(h.REPO / "examples" / "policy-eu.yaml")
    own = _preflight("-f", str(h.REPO / "examples" / "values-own-dc.yaml"), "--policy", policy,
                     *helm)
    check = _node_regions(own)
    assert check["status"] == "pass", check
    assert check["evidence"]["allowed_regions"] == ["eu-de-1", "eu-fr-1"]  # type: ignore[index]
    chart_default = tmp_path / "chart-default-regions.yaml"  # the chart's own sovereignty
    chart_default.write_text(yaml.safe_dump({"sovereignty": {
        "allowedRegions": ["eu-central-1"], "additionalRegions": []}}))
    default = _preflight("-f", str(h.REPO / "examples" / "values-own-dc.yaml"), "-f",
                         str(chart_default), "--policy", policy, *helm)
    check = _node_regions(default)
    assert check["status"] == "fail" and "eu-central-1" in str(check["verdict"]), check
