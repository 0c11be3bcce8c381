"""Helpers for the air-gap tests: local lockfiles, keys, bundle tampering, store snapshots."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from airgap.bundle import INDEX_NAME, SIGNATURE_NAME
from airgap.signing import sign_index
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
