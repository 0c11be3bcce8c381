"""Weights check: the weights in use match the lockfile and a verified model_signing signature."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gateway.preflight import Criteria, Inputs, run_preflight
from weights import LockedFile, LockEntry, Lockfile, git_blob_sha1, sha256_file
from weights.signing import sign_model

COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"


@pytest.fixture
def signed_model(tmp_path: Path) -> Inputs:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    files = [LockedFile(p.name, p.stat().st_size, sha256_file(p), git_blob_sha1(p),
                        p.suffix == ".safetensors") for p in sorted(model.iterdir())]
    lock = tmp_path / "weights.lock"
    Lockfile((LockEntry("acme/tiny", "main", COMMIT, tuple(files)),)).save(lock)
    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = tmp_path / "ec.pem", tmp_path / "ec.pub.pem"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    sig = tmp_path / "model.sig"
    sign_model(model, priv, sig)
    return Inputs(lockfile=lock, weights_dir=model, weights_signature=sig,
                  weights_public_key=pub)


def _weights(inputs: Inputs) -> tuple[str, str]:
    report, _ = run_preflight(inputs, Criteria())
    check = next(c for c in report.checks if c.id == "weights.locked-signed")
    return check.status, check.verdict


def test_locked_and_signed_weights_pass(signed_model: Inputs) -> None:
    assert _weights(signed_model) == (
        "pass", "1 model matches the lockfile and a verified signature")


def test_changed_weight_file_fails(signed_model: Inputs) -> None:
    assert signed_model.weights_dir is not None
    shard = signed_model.weights_dir / "model.safetensors"
    shard.write_bytes(b"\xff" + shard.read_bytes()[1:])  # same size, one byte changed
    assert _weights(signed_model) == (
        "fail", "acme/tiny: differs from the lockfile (1 changed, 0 missing, 0 extra)")


def test_unsigned_weights_fail(signed_model: Inputs) -> None:
    unsigned = Inputs(lockfile=signed_model.lockfile, weights_dir=signed_model.weights_dir)
    status, verdict = _weights(unsigned)
    assert status == "fail" and verdict.startswith("acme/tiny: no signature checked")


def test_signature_by_another_key_fails(signed_model: Inputs, tmp_path: Path) -> None:
    other = tmp_path / "other.pub.pem"
    other.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    inputs = Inputs(lockfile=signed_model.lockfile, weights_dir=signed_model.weights_dir,
                    weights_signature=signed_model.weights_signature, weights_public_key=other)
    status, verdict = _weights(inputs)
    assert status == "fail" and "signature does not verify" in verdict


def test_cache_ref_moved_to_another_snapshot_fails(signed_model: Inputs, tmp_path: Path) -> None:
    """The weights a loader resolves by repo id in a Hugging Face cache are checked, not only
    the pinned snapshot (tester's finding 10: refs/main -> a tampered second snapshot)."""
    import shutil

    from weights import install_hf_cache

    assert signed_model.lockfile is not None and signed_model.weights_dir is not None
    entry = Lockfile.load(signed_model.lockfile).entry("acme/tiny")
    cache = tmp_path / "cache"
    install_hf_cache(cache, entry, {f.path: signed_model.weights_dir / f.path
                                    for f in entry.files})
    inputs = Inputs(lockfile=signed_model.lockfile, weights_dir=cache,
                    weights_signature=signed_model.weights_signature,
                    weights_public_key=signed_model.weights_public_key)
    assert _weights(inputs)[0] == "pass"
    repo = cache / "models--acme--tiny"
    evil = "f" * 40
    shutil.copytree(repo / "snapshots" / COMMIT, repo / "snapshots" / evil)
    (repo / "refs" / "main").write_text(evil)
    assert _weights(inputs) == (
        "fail", f"acme/tiny: differs from the lockfile (0 changed, 0 missing, 0 extra); "
                f"refs/main names '{evil}', not the pinned commit; other snapshot "
                f"snapshots/{evil}")
