"""The bundle format: names, paths, index round trip, signature interop with stock OpenSSL."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from airgap_helpers import KeyPair, load_index

from airgap import Code, VerificationFailed
from airgap.bundle import DEFAULT_PART_SIZE
from airgap.paths import check_path, check_tree, part_name
from airgap.validate import parse_index


def test_default_part_size_fits_fat32() -> None:
    assert DEFAULT_PART_SIZE == 4 * 1024**3 - 1


@pytest.mark.parametrize(
    ("i", "n", "name"),
    [(0, 12, "payload.000-of-012"), (11, 12, "payload.011-of-012"),
     (999, 1000, "payload.0999-of-1000")],
)
def test_part_names_sort_in_order(i: int, n: int, name: str) -> None:
    assert part_name(i, n) == name
    names = [part_name(k, 1500) for k in range(1500)]
    assert names == sorted(names)


@pytest.mark.parametrize(
    "good", ["config.json", "1_Pooling/config.json", "notes/modèle-ü.md", "a.b/c..d", "..."]
)
def test_safe_paths_accepted(good: str) -> None:
    assert check_path(good) == good


@pytest.mark.parametrize(
    "bad", ["", "..", "../x", "a/../../x", "/abs", "a\\b", "C:x", "x\0y", "a//b", "a/", "./a",
            "x" * 256, "a\nb"],
)
def test_unsafe_paths_rejected(bad: str) -> None:
    with pytest.raises(VerificationFailed) as info:
        check_path(bad)
    assert info.value.code == Code.UNSAFE_PATH


def test_tree_collisions() -> None:
    check_tree(["a/b", "a/c", "b"], where="t")
    for paths in (["Readme.md", "README.md"], ["a", "a/b"], ["e\u0301.txt", "\u00e9.txt"]):
        with pytest.raises(VerificationFailed) as info:
            check_tree(paths, where="t")
        assert info.value.code == Code.PATH_COLLISION


def test_index_round_trips_byte_for_byte(pristine_bundle: Path) -> None:
    data = (pristine_bundle / "index.json").read_bytes()
    index = parse_index(data)
    assert index.dumps() == data
    doc = load_index(pristine_bundle)
    assert doc["format"] == "sovereign-gateway/airgap-bundle" and doc["format_version"] == 1
    assert [p["name"] for p in doc["parts"]] == [part_name(i, 4) for i in range(4)]


def test_signature_verifies_with_stock_openssl(
    pristine_bundle: Path, keys: KeyPair, tmp_path: Path
) -> None:
    """docs/bundle-format.md promises an operator can check index.sig with openssl alone."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed")
    sig = json.loads((pristine_bundle / "index.sig").read_text())
    (tmp_path / "sig.bin").write_bytes(base64.b64decode(sig["signature"]))
    cmd = [openssl, "pkeyutl", "-verify", "-pubin", "-inkey", str(keys.public_path), "-rawin",
           "-in", str(pristine_bundle / "index.json"), "-sigfile", str(tmp_path / "sig.bin")]
    ok = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    tampered = tmp_path / "index.json"
    tampered.write_bytes((pristine_bundle / "index.json").read_bytes().replace(b"tiny", b"tinY"))
    cmd[cmd.index(str(pristine_bundle / "index.json"))] = str(tampered)
    assert subprocess.run(cmd, capture_output=True, check=False).returncode != 0
