"""Helpers for the air-gap tests: local lockfiles, keys, bundle tampering, store snapshots."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from airgap import generate_keypair, load_private_key, load_public_key
from airgap.bundle import INDEX_NAME, SIGNATURE_NAME
from airgap.mlbom import BOM_NAME, read_extra
from airgap.signing import sign_index
from airgap.validate import parse_index
from weights import LockedFile, LockEntry, Lockfile, digest_file

LFS_SUFFIXES = (".safetensors", ".bin", ".onnx", ".h5", ".msgpack", ".ot")


def lock_entry_from_dir(
    root: Path,
    repo_id: str,
    *,
    commit: str | None = None,
    revision: str = "main",
    license: str | None = "apache-2.0",
) -> LockEntry:
    """Pin every file under ``root`` as the Hub would (sha256 + git blob SHA-1 computed here).

    Files with an LFS suffix (or > 10 MB) are marked LFS, as the Hub stores them.
    """
    files = []
    for p in sorted(root.rglob("*")):
        if p.is_dir():
            continue
        rel = p.relative_to(root).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue
        d = digest_file(p)
        lfs = rel.endswith(LFS_SUFFIXES) or d.size > 10 * 1024**2
        files.append(LockedFile(rel, d.size, d.sha256, None if lfs else d.git_sha1, lfs))
    if commit is None:
        commit = hashlib.sha1(repo_id.encode(), usedforsecurity=False).hexdigest()
    return LockEntry(
        repo_id=repo_id,
        requested_revision=revision,
        commit=commit,
        files=tuple(files),
        license=license,
        gated=False,
        pinned_at="2026-11-30T04:00:00Z",
    )


def write_lock(path: Path, *entries: LockEntry) -> Lockfile:
    lock = Lockfile(entries=entries)
    lock.save(path)
    return lock


def tree_state(root: Path) -> dict[str, Any]:
    """Everything observable under ``root``: type, mode, size, content digest, link target."""
    state: dict[str, Any] = {}
    if not root.exists():
        return state
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = p.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                state[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                state[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                state[rel] = ("file", st.st_size, hashlib.sha256(p.read_bytes()).hexdigest())
    return state


def load_index(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / INDEX_NAME).read_text(encoding="utf-8"))


def resign(bundle: Path, doc: dict[str, Any], key: Ed25519PrivateKey) -> None:
    """Rewrite index.json from ``doc`` and sign it with ``key`` (a trusted-but-hostile packer)."""
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    (bundle / INDEX_NAME).write_bytes(data)
    (bundle / SIGNATURE_NAME).write_bytes(sign_index(data, key))


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x01]))


REPO = "acme/tiny-model"


@dataclass
class KeyPair:
    private_path: Path
    public_path: Path
    private: Ed25519PrivateKey
    public: Ed25519PublicKey


def keypair(directory: Path, name: str) -> KeyPair:
    directory.mkdir(parents=True, exist_ok=True)
    priv = directory / f"{name}.pem"
    pub, _ = generate_keypair(priv)
    return KeyPair(priv, pub, load_private_key(priv), load_public_key(pub))



def make_small_model(root: Path) -> Path:
    """A small model: LFS weights spanning several parts, duplicates, an empty file, a subdir."""
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "bert", "hidden_size": 8}\n')
    (root / "model.safetensors").write_bytes(os.urandom(300_000))
    (root / "tokenizer.json").write_text('{"version": "1.0"}\n' * 500)
    (root / "empty.txt").write_bytes(b"")
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}\n')
    (root / "copy_of_config.json").write_text('{"model_type": "bert", "hidden_size": 8}\n')
    (root / "vocäb.txt").write_text("[PAD]\n[UNK]\nhello\n")
    return root


def rewrite_bom(bundle: Path, key: Ed25519PrivateKey,
                edit: Callable[[dict[str, object]], None]) -> None:
    """Re-write the ML-BOM (a signer's lie: bytes that match the re-signed index)."""
    index = parse_index((bundle / "index.json").read_bytes())
    old = read_extra(bundle, index, BOM_NAME)
    assert old is not None
    doc = json.loads(old)
    edit(doc)
    data = (json.dumps(doc, indent=2) + "\n").encode()
    idx = json.loads((bundle / "index.json").read_text())
    payload = b"".join((bundle / p["name"]).read_bytes() for p in idx["parts"])
    (blob,) = [b for b in idx["blobs"] if b["sha256"] == hashlib.sha256(old).hexdigest()]
    start, sha = blob["offset"], hashlib.sha256(data).hexdigest()
    payload = payload[:start] + data + payload[start + blob["stored_size"]:]
    delta = len(data) - blob["stored_size"]
    for f in idx["files"]:
        if f["path"] == BOM_NAME:
            f.update(size=len(data), sha256=sha, blob_id=sha)
    for b in idx["blobs"]:
        if b["offset"] > start:
            b["offset"] += delta
    blob.update(sha256=sha, size=len(data), stored_size=len(data))
    for p in idx["parts"]:
        (bundle / p["name"]).unlink()
    idx["payload_size"] = len(payload)
    idx["parts"] = [{"name": "payload.000-of-001", "offset": 0, "size": len(payload),
                     "sha256": hashlib.sha256(payload).hexdigest()}]
    idx["part_size"] = max(idx["part_size"], len(payload))
    (bundle / "payload.000-of-001").write_bytes(payload)
    raw = parse_index(json.dumps(idx).encode()).dumps()
    (bundle / "index.json").write_bytes(raw)
    (bundle / "index.sig").write_bytes(sign_index(raw, key))
