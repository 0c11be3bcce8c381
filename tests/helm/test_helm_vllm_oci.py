"""In-chart vLLM loading a model from an OCI artifact mounted as a Kubernetes image volume.

The vllm scenario's 8B model is switched from the PVC store to ``oci: {reference: ...}`` and
rendered by the real ``helm template``; values.schema.json must accept only a digest
reference and exactly one of ``storeClaim`` / ``oci`` per model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import sg_helm as h
import yaml

KUBE_SCHEMA_VERSION = "1.35.0"
DIGEST = "sha256:" + "ab" * 32
REFERENCE = f"registry.internal.example:5000/models/llama-3-1-8b@{DIGEST}"
NAME = "sg-sovereign-gateway-vllm-llama-3-1-8b"


def _values(tmp_path: Path, **model: Any) -> Path:
    """The vllm scenario with the 8B model's store keys replaced by ``model`` (None = drop)."""
    doc = yaml.safe_load(h.SCENARIOS["vllm"].read_text())
    m = doc["vllm"]["models"][0]
    for key in ("storeClaim", "storeSubPath"):
        m.pop(key)
    for key, value in model.items():
        if value is not None:
            m[key] = value
    out = tmp_path / "oci.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def _pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = h.one(objs, "Deployment", NAME)["spec"]["template"]["spec"]
    return spec


def test_oci_reference_renders_a_read_only_image_volume(tmp_path: Path) -> None:
    objs = h.render(h.SCENARIOS["vllm"],
                    _values(tmp_path, oci={"reference": REFERENCE, "pullPolicy": "IfNotPresent"}))
    pod = _pod(objs)
    volume = next(v for v in pod["volumes"] if v["name"] == "models")
    assert volume == {"name": "models",
                      "image": {"reference": REFERENCE, "pullPolicy": "IfNotPresent"}}
    c = pod["containers"][0]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "models")
    assert mount == {"name": "models", "mountPath": "/models/oci", "readOnly": True}
    # vLLM loads the mounted directory, offline; the Hub revision is not passed for a path.
    i = c["args"].index("--model")
    assert c["args"][i + 1] == "/models/oci"
    assert "--revision" not in c["args"]
    assert c["args"][c["args"].index("--served-model-name") + 1] == (
        "meta-llama/Llama-3.1-8B-Instruct")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    # The other model keeps its PVC store.
    other = h.one(objs, "StatefulSet", "sg-sovereign-gateway-vllm-llama-3-3-70b")
    vols = other["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in vols if v["name"] == "models")["persistentVolumeClaim"] == {
        "claimName": "models-store", "readOnly": True}
    # The pod is valid Kubernetes 1.35 (whose schema has volumes[].image).
    for obj in h.by_kind(objs, "Deployment") + h.by_kind(objs, "StatefulSet"):
        kubernetes_validate.validate(obj, KUBE_SCHEMA_VERSION, strict=True)


def test_pull_policy_defaults_to_if_not_present(tmp_path: Path) -> None:
    pod = _pod(h.render(h.SCENARIOS["vllm"], _values(tmp_path, oci={"reference": REFERENCE})))
    volume = next(v for v in pod["volumes"] if v["name"] == "models")
    assert volume["image"]["pullPolicy"] == "IfNotPresent"


def test_tag_reference_is_refused(tmp_path: Path) -> None:
    for ref in ("registry.internal.example/models/llama:v1",
                "registry.internal.example/models/llama",
                "registry.internal.example/models/llama@sha256:abc",
                f"registry.internal.example/models/llama:v1@{DIGEST.upper()}"):
        err = h.refuse(h.SCENARIOS["vllm"], _values(tmp_path, oci={"reference": ref}))
        assert "reference" in err, (ref, err)


def test_store_claim_and_oci_together_are_refused(tmp_path: Path) -> None:
    err = h.refuse(h.SCENARIOS["vllm"], _values(
        tmp_path, storeClaim="models-store", oci={"reference": REFERENCE}))
    assert "oneOf" in err or "storeClaim" in err, err
    # A subPath belongs to the PVC store only.
    err = h.refuse(h.SCENARIOS["vllm"], _values(
        tmp_path, storeSubPath="hub", oci={"reference": REFERENCE}))
    assert "oneOf" in err or "storeSubPath" in err, err
    # Neither is refused too: the model would have no weights.
    h.refuse(h.SCENARIOS["vllm"], _values(tmp_path))


def test_unknown_pull_policy_is_refused(tmp_path: Path) -> None:
    err = h.refuse(h.SCENARIOS["vllm"], _values(
        tmp_path, oci={"reference": REFERENCE, "pullPolicy": "Sometimes"}))
    assert "pullPolicy" in err, err
