"""weights verify: offline check of a directory or HF cache against the lock."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.hub_emulator import make_sharded
from tests.weights.cli_util import run_cli
from weights import (
    LockedFile,
    LockEntry,
    Lockfile,
    digest_file,
    install_hf_cache,
    verify_tree,
)
from weights.errors import CacheLayoutError, DigestMismatchError


def lock_dir(root: Path, repo_id: str = "org/model", commit: str = "a" * 40) -> LockEntry:
    """Build a lock entry from a local directory (as the air-gap tests do before pinning)."""
    files = []
    for p in sorted(root.rglob("*")):
        if p.is_file():
            d = digest_file(p)
            lfs = p.suffix == ".safetensors"
            files.append(LockedFile(p.relative_to(root).as_posix(), d.size, d.sha256,
                                    None if lfs else d.git_sha1, lfs))
    return LockEntry(repo_id, "main", commit, tuple(files), "mit", False, "2026-11-30T04:00:00Z")


@pytest.fixture
def sharded_dir(tmp_path: Path) -> Path:
    root = tmp_path / "model"
    root.mkdir()
    files = make_sharded([{"a": ("BF16", (64, 64))}, {"b": ("F32", (32,))}])
    files["config.json"] = b'{"model_type": "llama"}\n'
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


def test_clean_tree_verifies(sharded_dir: Path) -> None:
    entry = lock_dir(sharded_dir)
    r = verify_tree(sharded_dir, entry)
    assert r.ok and r.checked == 4
    assert r.bytes_checked == sum(f.size for f in entry.files)


def test_flipped_byte_same_size_is_a_sha256_mismatch(sharded_dir: Path) -> None:
    entry = lock_dir(sharded_dir)
    shard = sharded_dir / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    r = verify_tree(sharded_dir, entry)
    assert not r.ok
    [(path, expected, actual)] = r.mismatched
    assert path == shard.name
    assert expected == "sha256:" + entry.file(shard.name).sha256
    assert actual == "sha256:" + digest_file(shard).sha256


def test_regular_file_is_checked_by_git_sha1_too(sharded_dir: Path) -> None:
    entry = lock_dir(sharded_dir)
    cfg = entry.file("config.json")
    # A lock whose sha256 matches but whose git SHA-1 does not (inconsistent or forged entry).
    forged = LockedFile(cfg.path, cfg.size, cfg.sha256, "0" * 40, False)
    entry2 = LockEntry(entry.repo_id, "main", entry.commit,
                       tuple(f if f.path != cfg.path else forged for f in entry.files))
    r = verify_tree(sharded_dir, entry2)
    assert r.mismatched == (("config.json", "git-sha1:" + "0" * 40, "git-sha1:" + cfg.git_sha1),)


def test_missing_extra_and_missing_shard(sharded_dir: Path) -> None:
    entry = lock_dir(sharded_dir)
    (sharded_dir / "model-00002-of-00002.safetensors").unlink()
    (sharded_dir / "stray.safetensors").write_bytes(b"x")
    r = verify_tree(sharded_dir, entry)
    assert r.missing == ("model-00002-of-00002.safetensors",)
    assert r.extra == ("stray.safetensors",)
    assert r.missing_shards == ("model-00002-of-00002.safetensors",)
    assert verify_tree(sharded_dir, entry, ignore=["stray.*"]).extra == ()


def test_shard_missing_from_lock_and_disk_is_still_reported(sharded_dir: Path) -> None:
    # Pinned with --exclude of one shard: the lock itself is incomplete; vLLM would load the
    # checkpoint with missing tensors, so verify says so.
    (sharded_dir / "model-00002-of-00002.safetensors").unlink()
    entry = lock_dir(sharded_dir)
    r = verify_tree(sharded_dir, entry)
    assert not r.ok and r.missing == () and r.mismatched == ()
    assert r.missing_shards == ("model-00002-of-00002.safetensors",)


def test_hf_cache_layout_and_symlinked_snapshot(sharded_dir: Path, tmp_path: Path) -> None:
    entry = lock_dir(sharded_dir)
    cache = tmp_path / "cache"
    snap = install_hf_cache(cache, entry, {f.path: sharded_dir / f.path for f in entry.files})
    for where in (cache, cache / "models--org--model", snap):
        assert verify_tree(where, entry).ok, where
    # Corrupt a blob behind a symlink: caught through the snapshot.
    blob = cache / "models--org--model" / "blobs" / entry.file("config.json").blob_id
    blob.write_bytes(b'{"model_type": "llamb"}\n')
    assert [m.path for m in verify_tree(cache, entry).mismatched] == ["config.json"]
    other = LockEntry(entry.repo_id, "main", "b" * 40, entry.files)
    with pytest.raises(CacheLayoutError, match="no snapshot of pinned commit"):
        verify_tree(cache, other)


def test_install_refuses_bytes_that_do_not_match(sharded_dir: Path, tmp_path: Path) -> None:
    entry = lock_dir(sharded_dir)
    (sharded_dir / "config.json").write_bytes(b'{"model_type": "evil!"}\n')
    with pytest.raises(DigestMismatchError):
        install_hf_cache(tmp_path / "cache", entry,
                         {f.path: sharded_dir / f.path for f in entry.files})
    snaps = tmp_path / "cache" / "models--org--model" / "snapshots" / entry.commit
    assert not (snaps / "config.json").exists()
    assert not (tmp_path / "cache" / "models--org--model" / "refs" / "main").exists()


def test_cli_verify_exit_codes_and_json(sharded_dir: Path, tmp_path: Path) -> None:
    lock = tmp_path / "weights.lock"
    Lockfile((lock_dir(sharded_dir),)).save(lock)
    ok = run_cli(["verify", str(sharded_dir), "--lock", str(lock), "--json"])
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True
    (sharded_dir / "config.json").write_bytes(b'{"model_type": "llamA"}\n')
    (sharded_dir / "model-00002-of-00002.safetensors").unlink()
    bad = run_cli(["verify", str(sharded_dir), "--lock", str(lock), "--json"])
    assert bad.returncode == 1
    doc = json.loads(bad.stdout)["lock"]
    assert [m["path"] for m in doc["mismatched"]] == ["config.json"]
    assert doc["missing"] == doc["missing_shards"] == ["model-00002-of-00002.safetensors"]
    text = run_cli(["verify", str(sharded_dir), "--lock", str(lock)])
    assert text.returncode == 1 and "MISMATCH config.json" in text.stdout
    assert "MISSING SHARD" in text.stdout
    io = run_cli(["verify", str(tmp_path / "absent"), "--lock", str(lock)])
    assert io.returncode == 2 and "not a directory" in io.stderr
    nolock = run_cli(["verify", str(sharded_dir), "--lock", str(tmp_path / "none.lock")])
    assert nolock.returncode == 2 and "lockfile not found" in nolock.stderr
    shutil.rmtree(sharded_dir)
