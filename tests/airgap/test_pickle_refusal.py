"""airgap pack and unpack refuse pickle-based weights unless --allow-pickle, and then only a
state dict the allowlist scanner found safe, with its verdict carried in the signed index."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from airgap_helpers import (
    KeyPair,
    lock_entry_from_dir,
    make_small_model,
    rewrite_bom,
    write_lock,
)

from airgap import pack_bundle, unpack_bundle
from airgap.cli import main
from airgap.errors import VerificationFailed
from airgap.signing import sign_index
from airgap.validate import parse_index
from tests.weights import pickle_samples as S
from weights import SCANNER, Lockfile, SerialisationPolicy

REPO = "acme/legacy-bert"
ALLOW = SerialisationPolicy(allow_pickle=True)


def _model(tmp_path: Path, pickle_bytes: bytes) -> tuple[Path, Path]:
    src = make_small_model(tmp_path / "src")
    (src / "pytorch_model.bin").write_bytes(pickle_bytes)
    lock_path = tmp_path / "weights.lock"
    write_lock(lock_path, lock_entry_from_dir(src, REPO))
    return src, lock_path


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


def test_pack_refuses_pickle_by_default_with_one_line_naming_file_and_switch(
    tmp_path: Path, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    src, lock = _model(tmp_path, S.torch_zip(S.torch_state_dict_pickle()))
    out = tmp_path / "b"
    code = main(["pack", "--lock", str(lock), "--from", str(src), "--out", str(out),
                 "--key", str(keys.private_path), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert f"{REPO}:pytorch_model.bin: pickle-based file refused" in err
    assert "--allow-pickle" in err and len(err.splitlines()) == 1, err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".partial" in p.name]


def test_pack_refuses_malicious_pickle_even_with_the_switch(tmp_path: Path, keys: KeyPair) -> None:
    src, lock_path = _model(tmp_path, S.torch_zip(S.reduce_command(tmp_path / "m", 2)))
    with pytest.raises(VerificationFailed, match=r"posix\.system") as exc:
        pack_bundle(Lockfile.load(lock_path), src, tmp_path / "b", keys.private, policy=ALLOW)
    assert exc.value.codes == {"unsafe_serialisation"}
    assert not (tmp_path / "b").exists()


def test_safe_pickle_travels_with_its_verdict_and_unpack_requires_the_switch(
    tmp_path: Path, keys: KeyPair
) -> None:
    src, lock_path = _model(tmp_path, S.torch_zip(S.torch_state_dict_pickle()))
    bundle = tmp_path / "b"
    pack_bundle(Lockfile.load(lock_path), src, bundle, keys.private, policy=ALLOW)
    index = json.loads((bundle / "index.json").read_text())
    (pkl,) = [f for f in index["lock"]["models"][0]["files"] if f["path"] == "pytorch_model.bin"]
    assert pkl["scan"].startswith(f"{SCANNER}: safe (globals: collections.OrderedDict")
    others = [f for f in index["lock"]["models"][0]["files"] if f["path"] != "pytorch_model.bin"]
    assert all("scan" not in f for f in others)

    store = tmp_path / "store"
    with pytest.raises(VerificationFailed, match="--allow-pickle") as exc:
        unpack_bundle(bundle, [keys.public], store)
    assert exc.value.codes == {"unsafe_serialisation"}
    assert _tree(store) == []  # refused before anything was written
    report = unpack_bundle(bundle, [keys.public], store, layout="dir", policy=ALLOW)
    got = report.locations[REPO] / "pytorch_model.bin"
    assert got.read_bytes() == (src / "pytorch_model.bin").read_bytes()


def test_unpack_refuses_a_pickle_without_a_recorded_verdict(tmp_path: Path, keys: KeyPair) -> None:
    """A bundle from a packer without the policy (no ``scan`` in its signed index)."""
    src, lock_path = _model(tmp_path, S.torch_zip(S.torch_state_dict_pickle()))
    bundle = tmp_path / "b"
    pack_bundle(Lockfile.load(lock_path), src, bundle, keys.private, policy=ALLOW)
    doc = json.loads((bundle / "index.json").read_text())
    for f in doc["lock"]["models"][0]["files"]:
        f.pop("scan", None)
    data = parse_index(json.dumps(doc).encode()).dumps()
    (bundle / "index.json").write_bytes(data)
    (bundle / "index.sig").write_bytes(sign_index(data, keys.private))
    store = tmp_path / "store"
    with pytest.raises(VerificationFailed, match="without a safe verdict"):
        unpack_bundle(bundle, [keys.public], store, policy=ALLOW)
    assert _tree(store) == []
    shutil.rmtree(bundle)


def test_unpack_refuses_a_renamed_pickle_the_index_says_nothing_about(
    tmp_path: Path, keys: KeyPair
) -> None:
    """A signer whose packer recorded no verdict for a pickle called model.safetensors: the
    staged content is checked before anything is committed."""
    src = make_small_model(tmp_path / "src")
    (src / "model.safetensors").write_bytes(S.state_dict(4))  # a renamed (benign) pickle
    lock_path = tmp_path / "weights.lock"
    write_lock(lock_path, lock_entry_from_dir(src, REPO))
    bundle = tmp_path / "b"
    pack_bundle(Lockfile.load(lock_path), src, bundle, keys.private, policy=ALLOW)
    doc = json.loads((bundle / "index.json").read_text())
    for f in doc["lock"]["models"][0]["files"]:
        f.pop("scan", None)
    data = parse_index(json.dumps(doc).encode()).dumps()
    (bundle / "index.json").write_bytes(data)
    (bundle / "index.sig").write_bytes(sign_index(data, keys.private))

    def no_scans(bom: dict[str, Any]) -> None:  # that packer's ML-BOM records none either
        for f in bom["components"][0]["components"]:
            f["properties"] = [p for p in f.get("properties", [])
                               if p["name"] != "sovereign-gateway:scan"]

    rewrite_bom(bundle, keys.private, no_scans)
    store = tmp_path / "store"
    store.mkdir()
    with pytest.raises(VerificationFailed, match=r"model\.safetensors: pickle-based file refused"):
        unpack_bundle(bundle, [keys.public], store)
    assert _tree(store) == []
