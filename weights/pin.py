"""Pin a Hub repository at a commit: resolve the revision and record every selected file.

For LFS files the Hub publishes the content sha256 (``lfs.sha256``), recorded as is. Regular
files are identified on the Hub only by their git blob SHA-1, so they are downloaded (they are
small: configs, tokenizers), checked against that SHA-1 and hashed with sha256 as well.
"""

from __future__ import annotations

import fnmatch
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from weights.digests import digest_file
from weights.errors import DigestMismatchError, DriftError, LicenseRefusedError, WeightsError
from weights.lockfile import (
    LockedFile,
    LockEntry,
    Lockfile,
    check_repo_path,
    is_repo_id,
    validate_entry,
)
from weights.serialisation import DEFAULT_POLICY, SerialisationPolicy, check_format, check_names

if TYPE_CHECKING:  # annotations only: `weights lock` uses this module without the hub
    from weights.hub import HubClient, RemoteFile, RemoteSnapshot


@dataclass(frozen=True)
class Drift:
    """Difference between the pinned entry and what the revision resolves to now.

    Attributes:
        repo_id: Repository.
        revision: Requested revision.
        old_commit: Commit in the lockfile.
        new_commit: Commit the revision resolves to now.
        added: Paths selected now but not pinned.
        removed: Paths pinned but no longer selected / present.
        changed: Paths whose size or digest changed.
    """

    repo_id: str
    revision: str
    old_commit: str
    new_commit: str
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]

    @property
    def empty(self) -> bool:
        """True if nothing differs."""
        return (self.old_commit == self.new_commit and not self.added and not self.removed
                and not self.changed)


@dataclass(frozen=True)
class PinResult:
    """Outcome of :func:`pin`.

    Attributes:
        entry: The entry now in the lockfile (new, updated or unchanged).
        previous: The entry that was in the lockfile before, if any.
        drift: Differences to ``previous`` (None if there was no previous entry).
        written: Whether the lockfile was written.
        warnings: Things the operator should look at (e.g. excluded shards).
    """

    entry: LockEntry
    previous: LockEntry | None
    drift: Drift | None
    written: bool
    warnings: tuple[str, ...] = ()


def select(paths: Sequence[str], include: Sequence[str], exclude: Sequence[str]) -> list[str]:
    """Filter repository paths with ``fnmatch`` globs (huggingface_hub ``allow_patterns``
    semantics: a pattern ending in ``/`` matches everything below that folder).

    Returns:
        Paths matching any ``include`` (all if none given) and no ``exclude``.
    """

    def norm(p: str) -> str:
        return p + "*" if p.endswith("/") else p

    inc = [norm(p) for p in include]
    exc = [norm(p) for p in exclude]
    return [
        p for p in paths
        if (not inc or any(fnmatch.fnmatchcase(p, g) for g in inc))
        and not any(fnmatch.fnmatchcase(p, g) for g in exc)
    ]


def diff_entries(old: LockEntry, new: LockEntry) -> Drift:
    """Return what changed from ``old`` to ``new``."""
    old_files = {f.path: f for f in old.files}
    new_files = {f.path: f for f in new.files}
    return Drift(
        repo_id=new.repo_id,
        revision=new.requested_revision,
        old_commit=old.commit,
        new_commit=new.commit,
        added=tuple(sorted(new_files.keys() - old_files.keys())),
        removed=tuple(sorted(old_files.keys() - new_files.keys())),
        changed=tuple(sorted(
            p for p in old_files.keys() & new_files.keys()
            if (old_files[p].size, old_files[p].sha256) != (new_files[p].size, new_files[p].sha256)
        )),
    )


def check_license(snapshot: RemoteSnapshot, allowed: Sequence[str]) -> None:
    """Refuse a model whose licence is not in ``allowed`` (case-insensitive); no-op if empty.

    Raises:
        LicenseRefusedError: The licence is missing or not allowed.
    """
    if not allowed:
        return
    ok = {a.lower() for a in allowed}
    if snapshot.license is None or snapshot.license.lower() not in ok:
        raise LicenseRefusedError(
            f"{snapshot.repo_id}: licence {snapshot.license or '(none declared)'} is not in "
            f"the allowed list ({', '.join(sorted(ok))})"
        )


def _lock_file(
    hub: HubClient, snap: RemoteSnapshot, rf: RemoteFile, staging: Path,
    progress: Callable[[int], None] | None,
    policy: SerialisationPolicy = DEFAULT_POLICY,
) -> LockedFile:
    check_repo_path(rf.path)
    if rf.lfs_sha256 is not None:
        return LockedFile(path=rf.path, size=rf.size, sha256=rf.lfs_sha256, git_sha1=None,
                          lfs=True)
    blob = hub.fetch(snap.repo_id, rf.path, snap.commit, staging / rf.git_oid, rf.size, progress)
    d = digest_file(blob)
    if d.size != rf.size:
        raise DigestMismatchError(rf.path, f"size:{rf.size}", f"size:{d.size}")
    if d.git_sha1 != rf.git_oid:
        raise DigestMismatchError(rf.path, f"git-sha1:{rf.git_oid}", f"git-sha1:{d.git_sha1}")
    fmt = check_format(blob, f"{snap.repo_id}:{rf.path}", policy)  # a pickle by content, too
    return LockedFile(path=rf.path, size=d.size, sha256=d.sha256, git_sha1=d.git_sha1, lfs=False,
                      scan=fmt.scan)


def resolve_entry(
    hub: HubClient,
    repo_id: str,
    revision: str = "main",
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    allow_license: Sequence[str] = (),
    now: datetime | None = None,
    progress: Callable[[int], None] | None = None,
    policy: SerialisationPolicy = DEFAULT_POLICY,
) -> tuple[LockEntry, list[str]]:
    """Resolve ``revision`` on the hub and build a lock entry (nothing is written).

    Returns:
        The entry and warnings (e.g. shards named by an index but excluded by the globs).

    Raises:
        LicenseRefusedError: ``allow_license`` is set and the licence is not in it.
        WeightsError: No file selected; hub errors (see :class:`weights.hub.HubClient`).
        DigestMismatchError: A regular file downloaded does not match its git SHA-1.
        UnsafeSerialisationError: A selected file is pickle-based (by name; regular files
            also by content) and ``policy`` refuses it. LFS files are only fetched by ``pull``,
            which scans their content.
    """
    snap = hub.snapshot(repo_id, revision)
    check_license(snap, allow_license)
    chosen = set(select([f.path for f in snap.files], include, exclude))
    if not chosen:
        raise WeightsError(f"{snap.repo_id}@{revision}: no file matches the include/exclude globs")
    check_names(sorted(f"{snap.repo_id}:{p}" for p in chosen), policy)
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="weights-pin-") as tmp:
        files = tuple(
            _lock_file(hub, snap, rf, Path(tmp), progress, policy)
            for rf in snap.files if rf.path in chosen
        )
        for rf in snap.files:
            if rf.path in chosen and rf.path.endswith(".index.json") and rf.lfs_sha256 is None:
                warnings += _unpinned_shards(Path(tmp) / rf.git_oid, rf.path, chosen)
    entry = validate_entry(LockEntry(
        repo_id=snap.repo_id,
        requested_revision=revision,
        commit=snap.commit,
        files=files,
        license=snap.license,
        gated=snap.gated,
        pinned_at=stamp,
    ))
    return entry, warnings


def _unpinned_shards(index: Path, index_path: str, chosen: set[str]) -> list[str]:
    """Warnings for shards named by a ``weight_map`` but left out by the include/exclude globs."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = {str(v) for v in weight_map.values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [f"{index_path}: not a readable index (no weight_map)"]
    parent = PurePosixPath(index_path).parent
    left_out = sorted(p for p in ((parent / s).as_posix() for s in shards) if p not in chosen)
    return [f"{index_path} names {p}, which is not pinned (vLLM would miss its tensors)"
            for p in left_out]


def pin(
    hub: HubClient,
    lock_path: Path,
    repo_id: str,
    revision: str = "main",
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    allow_license: Sequence[str] = (),
    update: bool = False,
    now: datetime | None = None,
    progress: Callable[[int], None] | None = None,
    policy: SerialisationPolicy = DEFAULT_POLICY,
) -> PinResult:
    """Pin ``repo_id`` at ``revision`` into the lockfile at ``lock_path``.

    A new repository is added. For a repository already pinned, an unchanged resolution
    leaves the file byte-for-byte as it was (``pinned_at`` is kept); any change (moved
    branch, other file selection) is reported as :class:`Drift` and written only with
    ``update=True``.

    Raises:
        DriftError: The pin changed and ``update`` is False (``exc.drift`` holds the diff).
        LicenseRefusedError, LockfileError, HubError and subclasses.
    """
    if not is_repo_id(repo_id):
        if os.path.isdir(repo_id):  # a model already on disk: pin is for the Hub
            raise WeightsError(f"{repo_id!r} is a local directory, not a Hub repository id",
                               hint=f"to lock a model already on disk: weights lock {repo_id} "
                                    "--repo-id org/name")
        raise WeightsError(f"{repo_id!r} is not a repository id",
                           hint="use org/name as on the Hub, e.g. "
                                "sentence-transformers/all-MiniLM-L6-v2")
    lock = Lockfile.load_or_empty(lock_path)
    new, warnings = resolve_entry(hub, repo_id, revision, include=include, exclude=exclude,
                        allow_license=allow_license, now=now, progress=progress,
                        policy=policy)
    previous = lock.get(new.repo_id)
    if previous is None:
        lock.with_entry(new).save(lock_path)
        return PinResult(entry=new, previous=None, drift=None, written=True,
                         warnings=tuple(warnings))
    drift = diff_entries(previous, new)
    if drift.empty and previous.requested_revision == new.requested_revision:
        return PinResult(entry=previous, previous=previous, drift=drift, written=False,
                         warnings=tuple(warnings))
    if not update:
        if previous.commit != new.commit:
            what = (f"{revision} now resolves to {new.commit[:12]} "
                    f"(pinned {previous.commit[:12]} from {previous.requested_revision})")
        elif previous.requested_revision != new.requested_revision:
            what = (f"pinned from {previous.requested_revision}, now requested as {revision} "
                    f"(same commit {new.commit[:12]})")
        else:
            what = "the file selection changed"
        raise DriftError(
            f"{new.repo_id}: {what}; lockfile unchanged",
            hint="review the drift, then re-run with --update to accept it",
            drift=drift,
        )
    lock.with_entry(new).save(lock_path)
    return PinResult(entry=new, previous=previous, drift=drift, written=True,
                     warnings=tuple(warnings))
