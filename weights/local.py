"""Lock weights already on disk (``weights lock DIR``): no hub, no network.

Every regular file under DIR is digested (sha256 and git blob SHA-1, one pass) and checked
against the serialisation policy. The entry records ``origin: {"kind": "local", "path": ...}``
and, optionally, the upstream repository and commit the operator declares (a *claim*, kept
as such and never verified). DIR may be a plain directory or a Hugging Face cache snapshot
(``.../models--org--name/snapshots/<commit>``); for a snapshot, repository and commit are
read from the cache layout, again as a claim.

The entry's ``commit`` names the snapshot ``airgap unpack`` creates. It is always the
*content id* (the git-style SHA-1 of the manifest
``"sovereign-gateway local v1\\n" + "".join(f"{path}\\0{sha256}\\n")`` over files sorted by
path): the same bytes always lock to the same id and any change gives a new one. A claimed
commit (``--claim-commit``, or a cache snapshot's directory name) stays in ``origin`` and is
never used as the pin: no cache snapshot is ever named by a commit nobody verified.
``lfs`` follows the cache's blob names for a snapshot (64 hex: LFS), else ``.gitattributes``
``filter=lfs`` patterns, else the Hub's default (a weight suffix or more than 10 MiB).

Licence: the ``license`` key of the model card's YAML front matter (``README.md`` starting
with ``---``; Hugging Face model card specification), first one if a list.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from weights.digests import digest_file
from weights.errors import DriftError, WeightsError
from weights.lockfile import (
    LockedFile,
    LockEntry,
    Lockfile,
    Origin,
    is_commit_sha,
    is_repo_id,
    validate_entry,
)
from weights.modeltree import model_files
from weights.pin import PinResult, diff_entries
from weights.serialisation import DEFAULT_POLICY, SerialisationPolicy, check_format

#: Files above this size are LFS on the Hub by default, in bytes.
LFS_THRESHOLD_BYTES = 10 * 1024**2
#: Suffixes the Hub's default ``.gitattributes`` sends to LFS (subset that matters here).
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".onnx", ".h5",
                ".msgpack", ".ot", ".pkl", ".model", ".tflite", ".zip", ".tar.gz")
_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<sha>[0-9a-f]{40})")
_SKIP_DIRS = (".git", ".cache")  # VCS data; huggingface_hub local_dir metadata (.cache/huggingface)


def model_card_license(directory: Path) -> str | None:
    """Return the ``license`` of ``directory/README.md``'s YAML front matter, or None."""
    try:
        text = (directory / "README.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith("---"):
        return None
    end = text.find("\n---", 3)
    if end < 0:
        return None
    try:
        meta: Any = yaml.safe_load(text[3:end])
    except yaml.YAMLError:
        return None
    lic = meta.get("license") if isinstance(meta, dict) else None
    if isinstance(lic, list):
        lic = lic[0] if lic else None
    return str(lic) if lic is not None else None


def snapshot_claim(directory: Path) -> tuple[str, str] | None:
    """``(repo_id, commit)`` if ``directory`` is a Hugging Face cache snapshot, else None."""
    tail = "/".join(directory.absolute().parts[-3:])
    m = _SNAPSHOT.fullmatch(tail)
    if m is None:
        return None
    return f"{m['org']}/{m['name']}", m["sha"]


def _lfs_patterns(directory: Path) -> list[str]:
    try:
        lines = (directory / ".gitattributes").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    return [ln.split()[0] for ln in lines
            if ln.strip() and not ln.startswith("#") and "filter=lfs" in ln]


def _walk(directory: Path) -> list[tuple[str, Path]]:
    """Regular files under ``directory`` as (repository path, file), sorted, by the one tree
    rule every command applies (:func:`weights.modeltree.model_files`)."""
    return model_files(directory, skip_dirs=_SKIP_DIRS)


def content_id(files: tuple[LockedFile, ...]) -> str:
    """The 40-hex content id of a set of files (see the module docstring)."""
    h = hashlib.sha1(b"sovereign-gateway local v1\n", usedforsecurity=False)
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.sha256}\n".encode())
    return h.hexdigest()


def local_entry(
    directory: Path,
    *,
    repo_id: str | None = None,
    revision: str = "main",
    claimed_repo_id: str | None = None,
    claimed_commit: str | None = None,
    policy: SerialisationPolicy = DEFAULT_POLICY,
    now: datetime | None = None,
    progress: Callable[[int], None] | None = None,
) -> LockEntry:
    """Build the lock entry of a directory already on disk (nothing is written).

    Args:
        directory: Plain model directory or HF cache snapshot.
        repo_id: Name of the model in the lockfile (``org/name``); default: the claimed
            repository (or the snapshot's).
        revision: Revision name recorded (becomes ``refs/<revision>`` on unpack).
        claimed_repo_id: Declared upstream repository (not verified).
        claimed_commit: Declared upstream commit, 40 hex (not verified).
        policy: Serialisation policy applied to every file's content.
        now: Timestamp of the lock (default: now, UTC).
        progress: Byte-count callback while digesting.

    Returns:
        The validated entry.

    Raises:
        WeightsError: Not a directory, no files, no name.
        UnsafeTreeError: An unsafe name or link (:mod:`weights.modeltree`).
        UnsafeSerialisationError: A pickle-based file the policy refuses.
    """
    if not directory.is_dir():
        raise WeightsError(f"{directory} is not a directory")
    cached = snapshot_claim(directory)
    if cached is not None:
        claimed_repo_id = claimed_repo_id or cached[0]
        claimed_commit = claimed_commit or cached[1]
    name = repo_id or claimed_repo_id
    if name is None:
        raise WeightsError(f"{directory}: a model name is needed (no --repo-id given and the "
                           "directory does not say which model it is)",
                           hint="give --repo-id org/name (and --claim-repo/--claim-commit "
                                "if you know the upstream)")
    if not is_repo_id(name):
        raise WeightsError(f"{directory}: {name!r} is not a model name of the form org/name",
                           hint="give --repo-id org/name")
    if claimed_commit is not None and not is_commit_sha(claimed_commit):
        raise WeightsError(f"--claim-commit {claimed_commit!r} is not a 40-hex commit SHA")
    patterns = _lfs_patterns(directory)
    files: list[LockedFile] = []
    for rel, p in _walk(directory):
        d = digest_file(p, progress)
        fmt = check_format(p, f"{name}:{rel}", policy)
        if cached is not None and p.is_symlink():
            lfs = len(os.readlink(p).rsplit("/", 1)[-1]) == 64
        elif patterns:
            lfs = any(fnmatch.fnmatchcase(rel, g) or fnmatch.fnmatchcase(p.name, g)
                      for g in patterns)
        else:
            lfs = rel.endswith(LFS_SUFFIXES) or d.size > LFS_THRESHOLD_BYTES
        files.append(LockedFile(path=rel, size=d.size, sha256=d.sha256,
                                git_sha1=None if lfs else d.git_sha1, lfs=lfs, scan=fmt.scan))
    if not files:
        raise WeightsError(f"{directory} holds no file to lock")
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return validate_entry(LockEntry(
        repo_id=name,
        requested_revision=revision,
        commit=content_id(tuple(files)),  # a claim is never the pin (module docstring)
        files=tuple(files),
        license=model_card_license(directory),
        gated=False,
        pinned_at=stamp,
        origin=Origin(kind="local", path=str(directory.absolute()),
                      claimed_repo_id=claimed_repo_id, claimed_commit=claimed_commit),
    ))


def lock_local(
    lock_path: Path,
    directory: Path,
    *,
    update: bool = False,
    **kwargs: Any,
) -> PinResult:
    """Lock ``directory`` into the lockfile at ``lock_path`` (like ``pin``, without a hub).

    A new model is added. For a model already in the lockfile, unchanged content leaves the
    file byte-for-byte as it was; a change (files added, removed or changed, another claim)
    is reported as drift and written only with ``update=True``.

    Args:
        lock_path: The lockfile.
        directory: The model directory.
        update: Accept drift.
        **kwargs: Passed to :func:`local_entry`.

    Raises:
        DriftError: The directory changed since it was locked and ``update`` is False.
        WeightsError, UnsafeSerialisationError, LockfileError.
    """
    lock = Lockfile.load_or_empty(lock_path)
    new = local_entry(directory, **kwargs)
    previous = lock.get(new.repo_id)
    if previous is None:
        lock.with_entry(new).save(lock_path)
        return PinResult(entry=new, previous=None, drift=None, written=True)
    drift = diff_entries(previous, new)
    same = (drift.empty and previous.origin == new.origin
            and previous.requested_revision == new.requested_revision
            and previous.license == new.license)
    if same:
        return PinResult(entry=previous, previous=previous, drift=drift, written=False)
    if not update:
        raise DriftError(
            f"{new.repo_id}: {directory} differs from the locked content "
            f"({len(drift.added)} added, {len(drift.removed)} removed, "
            f"{len(drift.changed)} changed); lockfile unchanged",
            hint="review the drift, then re-run with --update to accept it",
            drift=drift,
        )
    lock.with_entry(new).save(lock_path)
    return PinResult(entry=new, previous=previous, drift=drift, written=True)


__all__ = ["content_id", "local_entry", "lock_local", "model_card_license", "snapshot_claim"]
