"""OpenSSF model signing: our signatures verify with the model_signing CLI and vice versa."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.weights.cli_util import ROOT, run_cli
from weights.errors import SignatureVerificationError, SigningError
from weights.signing import sign_model, verify_signature

MODEL_SIGNING = str(Path(sys.executable).parent / "model_signing")


def _keypair(d: Path, name: str, curve: ec.EllipticCurve | None = None) -> tuple[Path, Path]:
    key = ec.generate_private_key(curve or ec.SECP256R1())
    priv, pub = d / f"{name}.pem", d / f"{name}.pub.pem"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


@pytest.fixture
def model(tmp_path: Path, minilm_snapshot: Path) -> Path:
    """A small model dir: the real MiniLM configs/tokenizer (no 90 MB weights), a subfolder,
    a non-ASCII name and git metadata that model_signing leaves out."""
    root = tmp_path / "model"
    shutil.copytree(minilm_snapshot, root, ignore=shutil.ignore_patterns("model.safetensors"))
    (root / "notes").mkdir()
    (root / "notes" / "modèle.md").write_text("ü\n", encoding="utf-8")
    return root


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "keys"
    d.mkdir()
    priv, pub = _keypair(d, "signer")
    other_priv, other_pub = _keypair(d, "other", ec.SECP384R1())
    return {"priv": priv, "pub": pub, "other_priv": other_priv, "other_pub": other_pub}


def _ms(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MODEL_SIGNING, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, check=False)


def test_our_signature_verifies_with_model_signing_cli(model: Path, keys: dict[str, Path],
                                                       tmp_path: Path) -> None:
    sig = tmp_path / "model.sig"
    signed = sign_model(model, keys["priv"], sig)
    assert ".gitattributes" not in signed and "notes/modèle.md" in signed
    bundle = json.loads(sig.read_text())
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    r = _ms("verify", "key", str(model), "--signature", str(sig),
            "--public_key", str(keys["pub"]))
    assert r.returncode == 0, r.stdout + r.stderr
    r = _ms("verify", "key", str(model), "--signature", str(sig),
            "--public_key", str(keys["other_pub"]))
    assert r.returncode != 0


def test_model_signing_cli_signature_verifies_with_ours(model: Path, keys: dict[str, Path],
                                                        tmp_path: Path) -> None:
    sig = tmp_path / "theirs.sig"
    r = _ms("sign", "key", str(model), "--private_key", str(keys["priv"]), "--signature", str(sig))
    assert r.returncode == 0, r.stdout + r.stderr
    verified = verify_signature(model, sig, public_key=keys["pub"])
    assert "config.json" in verified and "notes/modèle.md" in verified
    # Same through our CLI, signature-only mode.
    out = run_cli(["verify", str(model), "--no-lock", "--signature", str(sig),
                   "--public-key", str(keys["pub"]), "--json"])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["signature"]["ok"] is True


def test_wrong_key_modified_added_and_removed_files_fail(model: Path, keys: dict[str, Path],
                                                         tmp_path: Path) -> None:
    sig = tmp_path / "model.sig"
    sign_model(model, keys["priv"], sig)
    with pytest.raises(SignatureVerificationError, match="does not verify"):
        verify_signature(model, sig, public_key=keys["other_pub"])
    vocab = model / "vocab.txt"
    data = bytearray(vocab.read_bytes())
    data[100] ^= 0x20
    vocab.write_bytes(bytes(data))
    with pytest.raises(SignatureVerificationError, match=r"modified vocab\.txt: signed sha256:"):
        verify_signature(model, sig, public_key=keys["pub"])
    data[100] ^= 0x20
    vocab.write_bytes(bytes(data))
    (model / "extra.safetensors").write_bytes(b"\0" * 8)
    with pytest.raises(SignatureVerificationError, match=r"unsigned extra\.safetensors"):
        verify_signature(model, sig, public_key=keys["pub"])
    (model / "extra.safetensors").unlink()
    (model / "modules.json").unlink()
    with pytest.raises(SignatureVerificationError, match=r"missing modules\.json"):
        verify_signature(model, sig, public_key=keys["pub"])
    out = run_cli(["verify", str(model), "--no-lock", "--signature", str(sig),
                   "--public-key", str(keys["pub"])])
    assert out.returncode == 1 and "missing modules.json" in out.stdout


def test_tampered_signature_file_fails(model: Path, keys: dict[str, Path], tmp_path: Path) -> None:
    sig = tmp_path / "model.sig"
    sign_model(model, keys["priv"], sig)
    bundle = json.loads(sig.read_text())
    import base64

    payload = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    payload["predicate"]["resources"][0]["digest"] = "00" * 32
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    sig.write_text(json.dumps(bundle))
    with pytest.raises(SignatureVerificationError):
        verify_signature(model, sig, public_key=keys["pub"])


def test_signature_inside_model_dir_and_cli_sign(model: Path, keys: dict[str, Path]) -> None:
    sig = model / "model.sig"
    r = run_cli(["sign", str(model), "--key", str(keys["priv"]), "--out", str(sig), "-q"])
    assert r.returncode == 0, r.stderr
    # The signature file is not part of what it signs, for us and for model_signing.
    verify_signature(model, sig, public_key=keys["pub"])
    r = _ms("verify", "key", str(model), "--signature", str(sig), "--public_key", str(keys["pub"]))
    assert r.returncode == 0, r.stdout + r.stderr


def test_key_and_keyless_configuration_errors(model: Path, keys: dict[str, Path],
                                              tmp_path: Path) -> None:
    sig = tmp_path / "model.sig"
    with pytest.raises(SigningError, match=r"signer\.pub\.pem: not a PEM private key .*takes EC "
                                           r"P-256, P-384 or P-521"):
        sign_model(model, keys["pub"], sig)
    sign_model(model, keys["priv"], sig)
    with pytest.raises(SigningError, match="--public-key, or --identity"):
        verify_signature(model, sig)
    bogus = tmp_path / "trusted_root.json"
    bogus.write_text("{}")
    with pytest.raises(SigningError, match="not a Sigstore trusted root"):
        verify_signature(model, sig, identity="a@example.com",
                         identity_provider="https://accounts.example.com", trust_root=bogus)
    with pytest.raises(SigningError, match="signature file not found"):
        verify_signature(model, tmp_path / "absent.sig", public_key=keys["pub"])
