"""The chart's ``preflight:`` values: the gateway's continuous pre-flight, its key and its packs.

Rendered with the real helm; the gateway pod's mounts are recreated (sg_pod_files) with a real
operator Ed25519 key in the Secret mount and a real audit verifier key in the ConfigMap, and
the real ``gateway check-config`` (which loads both keys) must accept the mounted config.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import sg_helm as h
import sg_pod_files as pf
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def _values(tmp_path: Path, **preflight: object) -> Path:
    if (tmp_path / "audit.key.pub").is_file():
        return _write(tmp_path, preflight)
    proc = subprocess.run(
        [str(h.require_tool(pf.GATEWAY_CLI)), "audit", "keygen", "--out",
         str(tmp_path / "audit.key"), "--pseudonym-key", str(tmp_path / "pseudonym.key")],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return _write(tmp_path, preflight)


def _write(tmp_path: Path, preflight: dict[str, object]) -> Path:
    path = tmp_path / f"preflight-values-{len(list(tmp_path.glob('preflight-values-*')))}.yaml"
    path.write_text(yaml.safe_dump({
        "audit": {"publicKey": (tmp_path / "audit.key.pub").read_text()},
        "preflight": {"enabled": True, **preflight}}))
    return path


def test_preflight_is_off_by_default() -> None:
    objs = h.render(h.SCENARIOS["default"])
    config = yaml.safe_load(h.one(objs, "ConfigMap", pf.CONFIG_MAP)["data"]["config.yaml"])
    assert "preflight" not in config
    assert not [o for o in h.by_kind(objs, "PersistentVolumeClaim")
                if o["metadata"]["name"].endswith("-evidence")]


def test_signed_packs_get_the_secret_key_and_a_kept_volume(tmp_path: Path) -> None:
    values = _values(tmp_path, signingKey={"existingSecret": "sg-operator-key"},
                     retentionDays=400, intervalSeconds=60)
    objs = h.render(h.SCENARIOS["default"], values)
    pod = pf.materialize(objs, tmp_path / "pod")
    section = pod.config["preflight"]
    assert section["interval_s"] == 60 and section["retention_days"] == 400
    assert section["regions"] == ["eu-central-1"]  # the chart's allowed regions
    # the operator key from the Secret; a real Ed25519 key where the Secret mount puts it
    key = Path(section["sign_key_file"])
    assert key.parent == tmp_path / "pod" / "etc/sovereign-gateway/operator-key"
    key.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    spec = h.one(objs, "Deployment", "sg-sovereign-gateway")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["operator-key"]["secret"]["secretName"] == "sg-operator-key"
    assert volumes["operator-key"]["secret"]["defaultMode"] == 0o400
    # the packs on their own PersistentVolumeClaim, kept by helm uninstall (evidence)
    assert volumes["evidence"]["persistentVolumeClaim"]["claimName"] == \
        "sg-sovereign-gateway-evidence"
    pvc = h.one(objs, "PersistentVolumeClaim", "sg-sovereign-gateway-evidence")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert Path(section["evidence_dir"]).is_dir()  # a mounted volume, not the read-only root
    assert Path(section["audit_public_key"]).is_file()
    code, out = pf.check_config(pod.config_file)
    assert code == 0, out


def test_without_a_key_no_packs_and_an_existing_claim_is_used(tmp_path: Path) -> None:
    objs = h.render(h.SCENARIOS["default"], _values(tmp_path))
    config = yaml.safe_load(h.one(objs, "ConfigMap", pf.CONFIG_MAP)["data"]["config.yaml"])
    assert "sign_key_file" not in config["preflight"]
    assert "evidence_dir" not in config["preflight"]
    objs = h.render(h.SCENARIOS["default"], _values(
        tmp_path, signingKey={"existingSecret": "k"}, evidence={"existingClaim": "packs"}))
    assert not [o for o in h.by_kind(objs, "PersistentVolumeClaim")
                if o["metadata"]["name"].endswith("-evidence")]
    spec = h.one(objs, "Deployment", "sg-sovereign-gateway")["spec"]["template"]["spec"]
    claim = {v["name"]: v for v in spec["volumes"]}["evidence"]["persistentVolumeClaim"]
    assert claim["claimName"] == "packs"


def test_schema_refuses_unknown_preflight_values(tmp_path: Path) -> None:
    err = h.refuse(h.SCENARIOS["default"], sets={"preflight.intervalSecond": "60"})
    assert "intervalSecond" in err
    err = h.refuse(h.SCENARIOS["default"],
                   sets={"preflight.evidence.accessModes[0]": "ReadMostly"})
    assert "accessModes" in err
