"""Delta bundles: `airgap pack --since OLD_INDEX` ships only the blobs the far side lacks;
unpack onto a store with the old revision installs and verifies the new one whole, and a
store missing a base blob is refused before anything is written."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from airgap_helpers import KeyPair, lock_entry_from_dir, write_lock

from airgap import pack_bundle, unpack_bundle
from airgap.cli import main
from airgap.errors import VerificationFailed
from weights import Lockfile, hf_cache_paths, verify_tree

REPO = "acme/dozen"


def _revision(root: Path, changed: bytes | None = None) -> Path:
    """Twelve files: weights shards (LFS) and configs; ``changed`` replaces shard 7's bytes."""
    root.mkdir(parents=True)
    for i in range(8):
        data = hashlib.sha256(f"shard {i}".encode()).digest() * 2000  # 64 000 bytes, distinct
        if i == 7 and changed is not None:
            data = changed
        (root / f"model-{i:05d}-of-00008.safetensors").write_bytes(data)
    for name in ("config.json", "tokenizer.json", "generation_config.json", "vocab.txt"):
        (root / name).write_text(f'{{"name": "{name}"}}\n')
    return root


def _commit(tag: str) -> str:
    return hashlib.sha1(tag.encode(), usedforsecurity=False).hexdigest()


def _tree(root: Path) -> list[tuple[str, int]]:
    return sorted((p.relative_to(root).as_posix(), p.lstat().st_mtime_ns)
                  for p in root.rglob("*")) if root.exists() else []


@pytest.fixture
def revisions(tmp_path: Path, keys: KeyPair) -> dict[str, Path]:
    old_src = _revision(tmp_path / "v1")
    new_src = _revision(tmp_path / "v2", changed=os.urandom(70_000))
    old_lock = write_lock(tmp_path / "v1.lock", lock_entry_from_dir(old_src, REPO,
                                                                    commit=_commit("v1")))
    new_lock = write_lock(tmp_path / "v2.lock", lock_entry_from_dir(new_src, REPO,
                                                                    commit=_commit("v2")))
    old_bundle = tmp_path / "v1.bundle"
    pack_bundle(old_lock, old_src, old_bundle, keys.private)
    delta = tmp_path / "v2.delta"
    pack_bundle(new_lock, new_src, delta, keys.private, since=old_bundle / "index.json")
    return {"old_src": old_src, "new_src": new_src, "old": old_bundle, "delta": delta}


def test_one_changed_file_of_twelve_ships_that_blob_only(revisions: dict[str, Path]) -> None:
    changed = revisions["new_src"] / "model-00007-of-00008.safetensors"
    index = json.loads((revisions["delta"] / "index.json").read_text())
    model_files = [f for f in index["files"] if f["repo_id"] == REPO]
    assert len(model_files) == 12 and len(index["lock"]["models"][0]["files"]) == 12
    (bom,) = [f for f in index["files"] if f["repo_id"] is None]  # the ML-BOM, always shipped
    assert bom["path"] == "ml-bom.cdx.json"
    changed_sha = hashlib.sha256(changed.read_bytes()).hexdigest()
    assert [b["sha256"] for b in index["blobs"]] == [changed_sha, bom["sha256"]]
    assert index["payload_size"] == changed.stat().st_size + bom["size"]
    assert changed.stat().st_size == 70_000
    assert len(index["base"]["blobs"]) == 11
    assert index["base"]["index_sha256"] == hashlib.sha256(
        (revisions["old"] / "index.json").read_bytes()).hexdigest()
    payload = sum(p.stat().st_size for p in revisions["delta"].glob("payload.*"))
    assert payload == 70_000 + bom["size"]


def test_delta_onto_the_old_revision_installs_the_new_one_verified_whole(
    revisions: dict[str, Path], keys: KeyPair, tmp_path: Path
) -> None:
    store = tmp_path / "cache"
    unpack_bundle(revisions["old"], [keys.public], store)
    report = unpack_bundle(revisions["delta"], [keys.public], store)
    assert report.written == 1 and report.skipped == 11
    assert report.refs_moved == {f"{REPO}@main": (_commit("v1"), _commit("v2"))}
    new_entry = Lockfile.load(tmp_path / "v2.lock").entry(REPO)
    assert verify_tree(report.locations[REPO], new_entry).ok
    paths = hf_cache_paths(store, REPO)
    assert (paths.refs / "main").read_text() == _commit("v2")
    assert paths.snapshot(_commit("v1")).is_dir()  # the old snapshot is kept


def test_delta_onto_a_store_missing_base_blobs_is_refused_before_writing(
    revisions: dict[str, Path], keys: KeyPair, tmp_path: Path
) -> None:
    empty = tmp_path / "empty-store"
    with pytest.raises(VerificationFailed) as exc:
        unpack_bundle(revisions["delta"], [keys.public], empty)
    assert exc.value.codes == {"delta_base_missing"} and len(exc.value.problems) == 11
    assert not empty.exists()
    # A store with the old revision but one damaged base blob: refused, nothing changes.
    store = tmp_path / "cache"
    unpack_bundle(revisions["old"], [keys.public], store)
    shard0 = revisions["old_src"] / "model-00000-of-00008.safetensors"
    damaged = hf_cache_paths(store, REPO).blob(hashlib.sha256(shard0.read_bytes()).hexdigest())
    damaged.write_bytes(b"x" * shard0.stat().st_size)
    before = _tree(store)
    with pytest.raises(VerificationFailed) as exc2:
        unpack_bundle(revisions["delta"], [keys.public], store)
    assert exc2.value.codes == {"delta_base_missing"}
    assert [p.path for p in exc2.value.problems] == [f"{REPO}:{shard0.name}"]
    assert "holds other content" in exc2.value.problems[0].message
    assert _tree(store) == before


def test_cli_packs_a_delta_verifies_it_and_inspect_says_so(
    revisions: dict[str, Path], keys: KeyPair, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "cli.delta"
    rc = main(["pack", "--lock", str(tmp_path / "v2.lock"), "--from", str(revisions["new_src"]),
               "--out", str(out), "--key", str(keys.private_path), "--since",
               str(revisions["old"]), "-q"])
    assert rc == 0, capsys.readouterr().err
    assert main(["verify", str(out), "--public-key", str(keys.public_path), "-q"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    assert "delta bundle: 11 blob(s)" in capsys.readouterr().out
    # Nothing changed since the base: refused, no bundle.
    rc = main(["pack", "--lock", str(tmp_path / "v1.lock"), "--from", str(revisions["old_src"]),
               "--out", str(tmp_path / "none"), "--key", str(keys.private_path), "--since",
               str(revisions["old"] / "index.json"), "-q"])
    assert rc == 2 and "nothing changed" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
