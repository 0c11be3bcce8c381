"""The evidence pack alone: DSSE PAE per the spec, signature and digests, tampering, errors."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.preflight import Criteria, Inputs, pae, run_preflight, write_pack
from gateway.preflight.evidence import ENVELOPE, PAYLOAD_TYPE, key_id, verify_pack
from tests.gateway.preflight.conftest import (
    NAMESPACE,
    SCENARIO_POLICY,
    TOKEN,
    FakeKube,
    write_kubeconfig,
)


def test_pae_matches_the_dsse_spec_test_vector() -> None:
    # secure-systems-lab/dsse protocol.md, "Test Vectors"
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world")
    assert pae("t\u00e9", b"") == "DSSEv1 3 t\u00e9 0 ".encode()  # LEN counts bytes


@pytest.fixture
def pack(tmp_path: Path, operator_key: tuple[Path, Path]) -> Path:
    report, facts = run_preflight(Inputs(policy=SCENARIO_POLICY),
                                  Criteria(regions=("eu-central-1",)))
    out = tmp_path / "pack"
    write_pack(out, report, facts, operator_key[0])
    return out


def _verify(out: Path, pub: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["preflight", "verify", str(out), "--key", str(pub), "--json"])
    text = capsys.readouterr().out
    return code, (json.loads(text) if text.strip() else {})


def test_verify_takes_public_key_as_every_other_verify_command(
        pack: Path, operator_key: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """``gateway audit verify``, ``weights verify``, ``airgap verify`` take ``--public-key``;
    ``preflight verify --public-key`` was ``No such option``."""
    capsys.readouterr()
    code = main(["preflight", "verify", str(pack), "--public-key", str(operator_key[1])])
    assert code == 0, capsys.readouterr().err
    assert "signature: verified" in capsys.readouterr().out


def test_pack_verifies_and_lists_every_file(pack: Path, operator_key: tuple[Path, Path],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, result = _verify(pack, operator_key[1], capsys)
    assert code == 0 and result["ok"] and result["signature"] == "verified"
    assert sorted(result["subjects"]) == ["evidence/policy.json", "report.json", "report.md"]
    policy = json.loads((pack / "evidence/policy.json").read_text())
    assert policy["revision"].startswith("sha256:")
    env = json.loads((pack / ENVELOPE).read_text())
    assert env["payloadType"] == PAYLOAD_TYPE
    statement = json.loads(base64.b64decode(env["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicate"]["checks"]["policy.destinations"] == "pass"
    from gateway.preflight.evidence import load_public

    assert env["signatures"][0]["keyid"] == key_id(load_public(operator_key[1]))


def test_added_or_removed_file_fails(pack: Path, operator_key: tuple[Path, Path],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    (pack / "evidence" / "extra.json").write_text("{}")
    (pack / "report.md").unlink()
    code, result = _verify(pack, operator_key[1], capsys)
    assert code == 1
    assert result["problems"] == ["report.md: missing",
                                  "evidence/extra.json: not covered by the signature"]


def test_wrong_key_or_edited_statement_fails(pack: Path, tmp_path: Path,
                                             operator_key: tuple[Path, Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    other = tmp_path / "other.pub"
    other.write_bytes(Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    code, result = _verify(pack, other, capsys)
    assert code == 1 and result["signature"] == "no signature verifies with the given key"
    env = json.loads((pack / ENVELOPE).read_text())
    statement = json.loads(base64.b64decode(env["payload"]))
    statement["predicate"]["result"] = "pass"
    statement["subject"] = statement["subject"][:1]  # drop files from the seal
    env["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (pack / ENVELOPE).write_text(json.dumps(env))
    code, result = _verify(pack, operator_key[1], capsys)
    assert code == 1 and result["signature"] == "no signature verifies with the given key"


def test_unsafe_subject_name_is_refused(pack: Path, operator_key: tuple[Path, Path]) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = serialization.load_pem_private_key(operator_key[0].read_bytes(), None)
    assert isinstance(key, Ed25519PrivateKey)
    statement = {"_type": "https://in-toto.io/Statement/v1", "predicateType":
                 "https://sovereign-gateway.dev/preflight/v1", "predicate": {},
                 "subject": [{"name": "../outside.txt", "digest": {"sha256": "0" * 64}}]}
    payload = json.dumps(statement).encode()
    sig = base64.b64encode(key.sign(pae(PAYLOAD_TYPE, payload))).decode()
    (pack / ENVELOPE).write_text(json.dumps({"payloadType": PAYLOAD_TYPE, "signatures": [
        {"keyid": "", "sig": sig}], "payload": base64.b64encode(payload).decode()}))
    result = verify_pack(pack, operator_key[1])
    assert not result.ok
    assert result.problems[0] == "../outside.txt: unsafe subject name"


def test_verify_usage_errors_exit_2(tmp_path: Path, operator_key: tuple[Path, Path],
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preflight", "verify", str(tmp_path), "--key", str(operator_key[1])]) == 2
    assert "not a readable DSSE envelope" in capsys.readouterr().err
    assert main(["preflight", "verify", str(tmp_path), "--key", str(operator_key[0])]) == 2


def test_out_refuses_a_non_empty_directory_and_needs_a_key(
        tmp_path: Path, operator_key: tuple[Path, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    args = ["preflight", "--policy", str(SCENARIO_POLICY), "--region", "eu-central-1",
            "--out", str(out)]
    assert main([*args, "--sign-key", str(operator_key[0])]) == 2
    assert "exists and is not an empty directory" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert main(args) == 2  # --out without --sign-key
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".busy")] == []


def test_unreadable_input_exits_2_naming_it(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preflight", "--policy", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert "nope.yaml" in err and err.count("\n") == 1


def test_pack_from_the_cluster_holds_networkpolicies_and_node_labels(
        fake_kube: FakeKube, tmp_path: Path, operator_key: tuple[Path, Path]) -> None:
    cfg = write_kubeconfig(tmp_path / "kubeconfig", fake_kube.url)
    report, facts = run_preflight(
        Inputs(policy=SCENARIO_POLICY, kubeconfig=cfg, namespace=NAMESPACE),
        Criteria(regions=("eu-central-1",)))
    out = tmp_path / "pack"
    write_pack(out, report, facts, operator_key[0])
    nodes = json.loads((out / "evidence/nodes.json").read_text())
    assert {n["topology.kubernetes.io/region"] for n in nodes.values()} == {"eu-central-1"}
    nps = json.loads((out / "evidence/networkpolicies.json").read_text())
    assert "sg-sovereign-gateway-default-deny" in {n["metadata"]["name"] for n in nps}
    blob = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    assert TOKEN.encode() not in blob  # the kubeconfig's credential never enters the pack
    assert verify_pack(out, operator_key[1]).ok
