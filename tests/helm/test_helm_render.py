"""The chart lints strictly, renders byte-stable, and every object is valid Kubernetes 1.35."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import sg_helm as h

KUBE_SCHEMA_VERSION = "1.35.0"
#: Custom resources kubernetes-validate has no schema for, with the fields we check instead.
CRDS = {
    ("cilium.io/v2", "CiliumNetworkPolicy"): ("endpointSelector", "egress"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("selector", "endpoints"),
}


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_lint_strict(scenario: str) -> None:
    res = h.helm("lint", "--strict", str(h.CHART), "-f", str(h.SCENARIOS[scenario]),
                 "--set-file", f"policy.document={h.SCENARIO_POLICIES[scenario]}",
                 "--kube-version", h.KUBE_VERSION)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 chart(s) failed" in res.stdout


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_render_matches_golden(scenario: str, update_golden: bool) -> None:
    text = h.render_text(h.SCENARIOS[scenario])
    golden = h.GOLDEN / f"{scenario}.yaml"
    if update_golden:
        golden.write_text(text, encoding="utf-8")
    assert golden.is_file(), f"{golden} missing: run pytest tests/helm --update-golden"
    expected = golden.read_text(encoding="utf-8")
    assert text == expected, (
        f"render of {scenario} differs from {golden.name}; review the diff and regenerate with "
        "`pytest tests/helm --update-golden` if the change is intended"
    )


def test_render_is_deterministic() -> None:
    """Two separate helm runs (no memoisation) give the same bytes: goldens can be exact."""
    args = h.template_args([h.SCENARIOS["vllm"]])
    first, second = h.run_helm(args), h.run_helm(args)
    assert first.returncode == 0 and first.stdout
    assert first.stdout == second.stdout


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_objects_validate_against_kubernetes_schema(scenario: str) -> None:
    objs = h.render(h.SCENARIOS[scenario])
    assert objs
    checked = 0
    for obj in objs:
        crd = CRDS.get((obj["apiVersion"], obj["kind"]))
        if crd is not None:
            assert all(field in obj["spec"] for field in crd), obj["metadata"]["name"]
            continue
        _validate(obj)
        checked += 1
    assert checked >= 8


def _validate(obj: dict[str, Any]) -> None:
    name = f'{obj["kind"]}/{obj["metadata"]["name"]}'
    try:
        kubernetes_validate.validate(obj, KUBE_SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{name} is not valid Kubernetes {KUBE_SCHEMA_VERSION}: "
                    f"{'.'.join(map(str, exc.path))}: {exc.message}")


def test_validator_catches_a_broken_object() -> None:
    """The schema check is real: a misspelt field in a rendered object is refused."""
    deploy = h.one(h.render(h.SCENARIOS["default"]), "Deployment", "sg-sovereign-gateway")
    deploy["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deploy, KUBE_SCHEMA_VERSION, strict=True)


def test_golden_update_needs_the_explicit_flag(tmp_path: Path) -> None:
    """Without the flag a changed render fails instead of silently rewriting the golden."""
    values = tmp_path / "changed.yaml"
    values.write_text("gateway:\n  logLevel: debug\n", encoding="utf-8")
    text = h.render_text(h.SCENARIOS["default"], values)
    assert text != (h.GOLDEN / "default.yaml").read_text(encoding="utf-8")


def test_packaged_chart_renders_like_the_source(tmp_path: Path) -> None:
    """`helm package` keeps every template (.helmignore drops nothing needed)."""
    res = h.helm("package", str(h.CHART), "--destination", str(tmp_path))
    assert res.returncode == 0, res.stderr
    (tgz,) = tmp_path.glob("sovereign-gateway-*.tgz")
    args = h.template_args([h.SCENARIOS["vllm"]])
    args[args.index(str(h.CHART))] = str(tgz)
    packaged = h.helm(*args)
    assert packaged.returncode == 0, packaged.stderr
    assert packaged.stdout == h.render_text(h.SCENARIOS["vllm"])
