"""The chart's identity values: issuers with their JWKS from a Secret, the mTLS trust bundle,
identity.required. Rendered with the real helm; the real ``gateway check-config`` loads the
mounted config with a real JWKS pinned by its sha256; refusals name the missing value."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import sg_helm as h
import sg_pod_files as pf
import yaml

ISSUER = "https://kc.example.eu/realms/ai"
#: An RSA public JWK that PyJWT parses (no token is verified here; only the file is loaded).
JWK = {"kty": "RSA", "kid": "kc-2026", "use": "sig", "e": "AQAB",
       "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV"
            "3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRd"
            "hS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t"
            "7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VDdL1VbC2tejvcI2BlMkEpk1BzB"
            "ZI0KQB0GaDWFLN-aEAw3vRw"}


def _values(tmp: Path, **identity: object) -> Path:
    path = tmp / "identity-values.yaml"
    path.write_text(yaml.safe_dump({"identity": identity}))
    return path


def _jwks_bytes() -> bytes:
    return json.dumps({"keys": [JWK]}).encode()


def test_issuers_render_mount_and_pass_check_config(tmp_path: Path) -> None:
    data = _jwks_bytes()
    values = _values(
        tmp_path, required=True, accept=["key", "jwt"], jwksSecret="idp-jwks",
        issuers=[{"issuer": ISSUER, "audiences": ["sovereign-gateway"], "algorithms": ["RS256"],
                  "jwksKey": "keycloak.json", "jwks_sha256": hashlib.sha256(data).hexdigest()}],
        rules=[{"id": "ml", "match": {"groups": "ml"}, "team": "ml", "models": ["*"]}])
    objs = h.render(h.SCENARIOS["default"], values)
    config = yaml.safe_load(h.one(objs, "ConfigMap", pf.CONFIG_MAP)["data"]["config.yaml"])
    section = config["identity"]
    assert section["required"] is True and section["accept"] == ["key", "jwt"]
    assert section["issuers"][0]["jwks_file"] == "/etc/sovereign-gateway/jwks/keycloak.json"
    assert "jwksKey" not in section["issuers"][0] and "mtls" not in section
    container = pf.gateway_container(objs)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["identity-jwks"]["mountPath"] == "/etc/sovereign-gateway/jwks"
    assert "subPath" not in mounts["identity-jwks"]  # the kubelet updates it in place
    pod = pf.materialize(objs, tmp_path / "pod")
    jwks_file = Path(pod.config["identity"]["issuers"][0]["jwks_file"])
    jwks_file.write_bytes(data)  # the operator's Secret
    code, out = pf.check_config(pod.config_file)
    assert code == 0, out
    jwks_file.write_bytes(data + b"\n")  # a JWKS that does not match its pin
    code, out = pf.check_config(pod.config_file)
    assert code != 0 and "jwks_sha256" in json.dumps(out)


def test_mtls_trust_bundle_is_mounted(tmp_path: Path) -> None:
    values = _values(tmp_path, accept=["key", "mtls"],
                     mtls={"trustBundleSecret": "workload-ca", "secretKey": "bundle.pem"})
    objs = h.render(h.SCENARIOS["default"], values)
    config = yaml.safe_load(h.one(objs, "ConfigMap", pf.CONFIG_MAP)["data"]["config.yaml"])
    assert config["identity"]["mtls"] == {"trust_bundle_file": "/etc/sovereign-gateway/mtls/ca.pem"}
    pod = h.one(objs, "Deployment", pf.DEPLOYMENT)["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "identity-mtls")
    assert volume["secret"]["secretName"] == "workload-ca"
    assert volume["secret"]["items"] == [{"key": "bundle.pem", "path": "ca.pem"}]


def test_no_identity_values_render_no_identity(tmp_path: Path) -> None:
    objs = h.render(h.SCENARIOS["default"])
    config = yaml.safe_load(h.one(objs, "ConfigMap", pf.CONFIG_MAP)["data"]["config.yaml"])
    assert "identity" not in config
    assert not {"identity-jwks", "identity-mtls"} & {
        m["name"] for m in pf.gateway_container(objs)["volumeMounts"]}


def test_required_without_issuers_or_bundle_is_refused(tmp_path: Path) -> None:
    err = h.refuse(h.SCENARIOS["default"], _values(tmp_path, required=True))
    assert "identity.required is true but identity.issuers is empty" in err
    err = h.refuse(h.SCENARIOS["default"], _values(
        tmp_path, issuers=[{"issuer": ISSUER, "audiences": ["a"], "jwks_sha256": "0" * 64}]))
    assert "identity.jwksSecret is not" in err
    err = h.refuse(h.SCENARIOS["default"], _values(
        tmp_path, jwksSecret="x", issuers=[{"issuer": ISSUER, "audiences": ["a"],
                                            "jwks_sha256": "0" * 64, "algorithms": ["HS256"]}]))
    assert "HS256" in err or "algorithms" in err
