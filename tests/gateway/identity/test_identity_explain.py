"""``gateway identity explain``: a real token (or claims) through the same verification, rules
and egress policy as a request; a refused token exits 1 with its code."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gateway.audit import generate_key_file
from tests.gateway.egress_testdata import gateway_config, policy_text
from tests.gateway.gateway_cli import gateway
from tests.gateway.identity.jwtkit import ISSUER, SigningKey, identity_section, write_jwks


def _config(tmp: Path, key: SigningKey) -> Path:
    policy = tmp / "policy.yaml"
    policy.write_text(policy_text({"eu-a": 9001, "eu-b": 9002, "us": 9003}))
    urls = {n: f"http://127.0.0.1:{p}" for n, p in (("eu-a", 9001), ("eu-b", 9002),
                                                     ("us", 9003))}
    cfg = gateway_config(urls, policy)
    jwks = tmp / "jwks.json"
    section = identity_section(jwks, write_jwks(jwks, key))
    section["pseudonym_key_file"] = str(generate_key_file(tmp / "pseudonym.key"))
    section["rules"] = [
        {"id": "hr", "match": {"groups": "hr"}, "team": "eng", "models": ["m"],
         "data_class": "confidential"},
        {"id": "vendors", "match": {"roles": ["vendor", "contractor"]}, "team": "contractors",
         "models": ["m"], "data_class": "public"},
    ]
    cfg["identity"] = section
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_token_is_explained_with_its_egress(tmp_path: Path) -> None:
    key = SigningKey("k1")
    path = _config(tmp_path, key)
    token = key.token(groups=["staff", "hr"])
    res = gateway("identity", "explain", "--config", str(path), "--token", token,
                  "--model", "m", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert (out["verified"], out["rule"], out["team"], out["data_class"]) == (
        True, "hr", "eng", "confidential")
    assert out["decided_by"] == {"groups": "hr"} and out["kid"] == "k1"
    assert out["issuer"] == ISSUER and out["subject"].startswith("hmac-sha256:")
    assert (out["rule_source"], out["rule_source_implicit"]) == (ISSUER, True)
    allowed = {d["destination"] for d in out["egress"] if d["decision"] == "allow"}
    assert allowed == {"eu-a"}  # confidential: EU with no-retention only

    text = gateway("identity", "explain", "--config", str(path), "--token", token,
                   "--model", "m")
    assert "rule hr matched on groups=hr" in text.output and "eu-a: allow" in text.output
    assert f"(source {ISSUER}, implicit: the only source)" in text.output, text.output


def test_claims_without_a_token_are_marked_unverified(tmp_path: Path) -> None:
    path = _config(tmp_path, SigningKey("k1"))
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps({"iss": ISSUER, "sub": "v@vendor.example",
                                  "roles": ["contractor"]}))
    res = gateway("identity", "explain", "--config", str(path), "--claims", str(claims),
                  "--model", "m", "--json")
    out = json.loads(res.output)
    assert out["verified"] is False and out["rule"] == "vendors"
    assert all(d["decision"] == "deny" and d["rule_id"] == "block-contractor"
               for d in out["egress"])


def test_a_refused_token_exits_1_with_its_code(tmp_path: Path) -> None:
    key = SigningKey("k1")
    path = _config(tmp_path, key)
    for token, code in ((key.token(exp=1, iat=0), "token_expired"),
                        (key.token(groups=["nobody"]), "identity_not_mapped"),
                        (SigningKey("k1").token(), "token_signature_invalid")):
        res = gateway("identity", "explain", "--config", str(path), "--token", token, "--json")
        assert res.exit_code == 1, res.output
        assert json.loads(res.output)["code"] == code


def test_nested_and_dotted_claim_names() -> None:
    from gateway.identity.rules import claim_value

    sa = {"sub": "system:serviceaccount:ml:scorer",
          "kubernetes.io": {"namespace": "ml", "serviceaccount": {"name": "scorer"}},
          "realm_access": {"roles": ["chat"]}}
    assert claim_value(sa, "kubernetes.io.namespace") == "ml"
    assert claim_value(sa, "kubernetes.io.serviceaccount.name") == "scorer"
    assert claim_value(sa, "realm_access.roles") == ["chat"]
    assert claim_value(sa, "kubernetes.io.missing") is None
    assert claim_value(sa, "nope.namespace") is None


def test_a_model_outside_the_rule_is_refused_without_egress_decisions(tmp_path: Path) -> None:
    """``--model m2`` that the rule does not grant: one answer, refused (exit 1), and no
    egress lines saying ``allow`` for a request that would be refused with 403 first."""
    key = SigningKey("k1")
    path = _config(tmp_path, key)
    cfg = yaml.safe_load(path.read_text())
    cfg["models"].append({**cfg["models"][0], "name": "m2"})
    path.write_text(yaml.safe_dump(cfg))
    token = key.token(groups=["hr"])
    res = gateway("identity", "explain", "--config", str(path), "--token", token,
                  "--model", "m2")
    assert res.exit_code == 1, res.output
    assert "model m2: NOT allowed" in res.output
    assert ": allow (" not in res.output and ": deny (" not in res.output, res.output
    out = json.loads(gateway("identity", "explain", "--config", str(path), "--token", token,
                             "--model", "m2", "--json").output)
    assert out["model_allowed"] is False and "egress" not in out


def test_an_implicit_rule_holds_only_for_its_one_source(tmp_path: Path) -> None:
    # The rules name no issuer: with one issuer configured they trust that issuer alone, so
    # claims of another issuer (or of "mtls", the certificates' name) never meet them.
    path = _config(tmp_path, SigningKey("k1"))
    claims = tmp_path / "claims.json"
    for iss in ("mtls", "https://other.example/tenant-2"):
        claims.write_text(json.dumps({"iss": iss, "sub": "m@x.example", "groups": ["hr"]}))
        res = gateway("identity", "explain", "--config", str(path), "--claims", str(claims),
                      "--json")
        assert res.exit_code == 1, res.output
        assert json.loads(res.output)["code"] == "identity_not_mapped"
