"""Which key each command takes: ``weights keygen`` makes the EC key of ``weights sign``; the
Ed25519 key of ``airgap keygen`` (bundles) is refused by ``weights`` in one line, and back."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from airgap.cli import main as airgap_main
from tests.weights.cli_util import run_cli
from tests.weights.test_weights_signing import _ms

SUPPORTED = "takes EC P-256, P-384 or P-521 keys (PEM); make one with `weights keygen`"


@pytest.fixture
def model(tmp_path: Path, minilm_snapshot: Path) -> Path:
    root = tmp_path / "model"
    shutil.copytree(minilm_snapshot, root, ignore=shutil.ignore_patterns("model.safetensors"))
    return root


@pytest.fixture
def airgap_key(tmp_path: Path) -> Path:
    key = tmp_path / "bundle-key.pem"
    assert airgap_main(["keygen", "--out", str(key)]) == 0
    return key


def test_sign_with_the_airgap_ed25519_key_is_refused_in_one_line(
    model: Path, airgap_key: Path, tmp_path: Path
) -> None:
    sig = tmp_path / "model.sig"
    res = run_cli(["sign", str(model), "--key", str(airgap_key), "--out", str(sig), "--quiet"])
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        f"weights: error [signing_error]: {airgap_key}: Ed25519 key (as `airgap keygen` makes, for "
        f"bundles) is not supported: weights signing (OpenSSF model signing) {SUPPORTED}"]
    assert not sig.exists()


def test_verify_with_the_airgap_public_key_is_refused_in_one_line(
    model: Path, airgap_key: Path, tmp_path: Path
) -> None:
    (tmp_path / "model.sig").write_text("{}")
    res = run_cli(["verify", str(model), "--no-lock", "--signature", str(tmp_path / "model.sig"),
                   "--public-key", str(airgap_key.with_name("bundle-key.pub"))])
    assert res.returncode == 2
    [line] = res.stderr.splitlines()
    assert "Ed25519 key" in line and SUPPORTED in line


def test_keygen_sign_verify_round_trip_also_with_model_signing(
    model: Path, tmp_path: Path
) -> None:
    key = tmp_path / "keys" / "model-key.pem"
    key.parent.mkdir()
    res = run_cli(["keygen", "--out", str(key)])
    assert res.returncode == 0, res.stderr
    pub = key.with_name("model-key.pub")
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert pub.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    sig = tmp_path / "model.sig"
    assert run_cli(["sign", str(model), "--key", str(key), "--out", str(sig),
                    "--quiet"]).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys", "model", "model.sig"]
    ours = run_cli(["verify", str(model), "--no-lock", "--signature", str(sig),
                    "--public-key", str(pub)])
    assert ours.returncode == 0, ours.stderr
    theirs = _ms("verify", "key", str(model), "--signature", str(sig), "--public_key", str(pub))
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    # Never overwrites a key.
    again = run_cli(["keygen", "--out", str(key)])
    assert again.returncode == 2 and "exists" in again.stderr


def test_airgap_refuses_the_weights_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        model: Path) -> None:
    key = tmp_path / "model-key.pem"
    assert run_cli(["keygen", "--out", str(key)]).returncode == 0
    (tmp_path / "weights.lock").write_text('{"version": 1, "models": []}')
    rc = airgap_main(["pack", "--lock", str(tmp_path / "weights.lock"), "--from", str(model),
                      "--out", str(tmp_path / "b"), "--key", str(key)])
    assert rc == 2
    assert "is not an Ed25519 key (use `airgap keygen`)" in capsys.readouterr().err


def test_sign_names_the_files_it_leaves_out(model: Path, tmp_path: Path) -> None:
    """``weights sign`` signed 12 of the snapshot's 13 files and did not say that
    ``.gitattributes`` (git metadata, left out as OpenSSF model signing leaves it out) was not
    covered; an ``--ignore`` glob's files are named too."""
    key = tmp_path / "model-key.pem"
    assert run_cli(["keygen", "--out", str(key)]).returncode == 0
    (model / ".gitattributes").write_text("*.bin filter=lfs\n")
    (model / "notes.txt").write_text("local notes\n")
    res = run_cli(["sign", str(model), "--key", str(key), "--out", str(tmp_path / "m.sig"),
                   "--ignore", "notes.txt"])
    assert res.returncode == 0, res.stderr
    files = sum(1 for p in model.rglob("*") if p.is_file())
    assert f"signed {files - 2} files of {model}" in res.stdout
    assert "left out 2: .gitattributes, notes.txt (git metadata" in res.stdout
