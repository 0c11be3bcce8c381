"""Download exactly the pinned bytes and make them visible only once verified.

Each file is fetched by commit SHA (never a branch) into a private staging cache next to the
destination (same filesystem, so the final step is a rename), hashed, compared with the lock
and only then renamed into place:

* ``--into DIR``: ``DIR/<path>`` (plain directory, loadable by path);
* ``--cache DIR``: the Hugging Face cache layout (``blobs/``, ``snapshots/<commit>/``,
  ``refs/<revision>``), loadable by repo id with ``HF_HUB_OFFLINE=1``.

An interrupted download resumes: the staging area keeps ``<blob_id>.part`` files and the
download continues with an HTTP Range request, both after a dropped connection within one run
and on the next run (huggingface_hub 2.x discards partial files, so this is done here with its
session and URL scheme). A file that fails verification is deleted from staging and the
pull fails with its name and both digests.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from weights.cache import (
    hf_cache_paths,
    install_blob,
    link_snapshot_file,
    repo_folder_name,
    write_ref,
)
from weights.digests import ProgressCallback
from weights.errors import CacheLayoutError, DigestMismatchError, StorageError, WeightsError
from weights.hub import HubClient
from weights.lockfile import LockedFile, LockEntry, Lockfile
from weights.serialisation import DEFAULT_POLICY, SerialisationPolicy, check_format, check_names
from weights.verify import check_file

STAGING_NAME = ".weights-staging"

_log = logging.getLogger(__name__)

FileEvent = Callable[[LockedFile, str], None]
"""Called per file with an outcome: ``"reused"``, ``"downloaded"``."""


@dataclass
class PullResult:
    """What :func:`pull_entry` did.

    Attributes:
        repo_id: Repository.
        commit: Pinned commit.
        target: Directory holding the files (plain dir or the cache snapshot dir).
        downloaded: Paths fetched from the hub.
        reused: Paths already present and verified.
        bytes_downloaded: Size of the downloaded files, in bytes.
    """

    repo_id: str
    commit: str
    target: Path
    downloaded: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    bytes_downloaded: int = 0


def staging_part(staging: Path, entry: LockEntry, locked: LockedFile) -> Path:
    """Partial-download path of a pinned file in the staging area (named by content id, so a
    resumed part can only continue the same bytes; verification catches anything else)."""
    return staging / repo_folder_name(entry.repo_id) / f"{locked.blob_id}.part"


def _inside(root: Path, path: Path) -> Path:
    """Return ``path`` after checking its parent resolves inside ``root`` (no symlink escape)."""
    real_root = root.resolve()
    parent = path.parent.resolve()
    if parent != real_root and real_root not in parent.parents:
        raise CacheLayoutError(f"{path} would be written outside {root} (symlinked folder?)")
    return path


def _verify_staged(blob: Path, locked: LockedFile) -> None:
    mm = check_file(blob, locked)
    if mm is not None:
        blob.unlink(missing_ok=True)
        raise DigestMismatchError(mm.path, mm.expected, mm.actual)


def _check_space(entry: LockEntry, staging: Path, finals: dict[str, Path], root: Path) -> None:
    """Refuse up front when the destination's file system cannot hold what is still to be
    downloaded: files not yet in place (``finals``: path -> final location), less the bytes
    of resumable ``.part`` files.

    Raises:
        StorageError: Not enough free space.
    """
    missing = 0
    for locked in entry.files:
        done = finals[locked.path]
        if done.is_file() and done.stat().st_size == locked.size:
            continue  # in place (its content is checked before reuse)
        part = staging_part(staging, entry, locked)
        missing += locked.size - (part.stat().st_size if part.is_file() else 0)
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if missing > free:
        raise StorageError(
            f"{entry.repo_id}: needs {missing} bytes, {free} free on the file system of {probe}",
            hint="free space there or pull to another disk (--into/--cache)",
        )


def _reusable(path: Path, locked: LockedFile) -> bool:
    return path.is_file() and check_file(path, locked) is None


def pull_entry(
    hub: HubClient,
    entry: LockEntry,
    *,
    into: Path | None = None,
    cache: Path | None = None,
    staging: Path | None = None,
    progress: ProgressCallback | None = None,
    on_file: FileEvent | None = None,
    policy: SerialisationPolicy = DEFAULT_POLICY,
) -> PullResult:
    """Fetch and verify every file of ``entry`` into a plain directory or an HF cache.

    Args:
        hub: Client of the configured hub.
        entry: The pinned entry.
        into: Plain destination directory (exclusive with ``cache``).
        cache: Hugging Face cache root (exclusive with ``into``).
        staging: Private staging cache (default: beside the destination, same filesystem).
            Kept on failure so the next run resumes; removed on success.
        progress: Byte-count callback (downloaded bytes, and sizes of reused files).
        on_file: Per-file outcome callback.
        policy: Serialisation policy: a pickle-based file (by name, before any download, or
            by content, once verified) is refused unless ``policy.allow_pickle`` and the
            allowlist scanner finds it safe (:mod:`weights.serialisation`).

    Returns:
        A :class:`PullResult`.

    Raises:
        DigestMismatchError: A downloaded file does not match the lock (it was deleted).
        HubError and subclasses: The hub refused or failed.
        CacheLayoutError: The destination cannot be written safely.
        UnsafeSerialisationError: A file is pickle-based and refused (nothing of it is kept).
    """
    if (into is None) == (cache is None):
        raise WeightsError("give exactly one of into= (plain directory) or cache= (HF cache)")
    check_names((f"{entry.repo_id}:{f.path}" for f in entry.files), policy)
    if into is not None:
        lock = into.parent / f".{into.name}.weights-pull.lock"
        where = into
    else:
        assert cache is not None
        lock = cache / ".locks" / "weights-pull.lock"  # .locks/: ignored by scan_cache_dir
        where = cache
    with _exclusive(lock, where):
        return _pull_entry(hub, entry, into=into, cache=cache, staging=staging,
                           progress=progress, on_file=on_file, policy=policy)


@contextmanager
def _exclusive(lock: Path, where: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock`` (waiting, with a warning, if another pull into
    ``where`` holds it): pulls into one destination share the staging area."""
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise StorageError(f"cannot create {lock}: {exc.strerror or exc}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log.warning("waiting for another weights pull into %s to finish", where)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _pull_entry(
    hub: HubClient,
    entry: LockEntry,
    *,
    into: Path | None,
    cache: Path | None,
    staging: Path | None,
    progress: ProgressCallback | None,
    on_file: FileEvent | None,
    policy: SerialisationPolicy = DEFAULT_POLICY,
) -> PullResult:
    if into is not None:
        dest_root = into
        staging = staging or into.parent / f".{into.name}{STAGING_NAME}"
        target = into
    else:
        assert cache is not None
        paths = hf_cache_paths(cache, entry.repo_id)
        dest_root = paths.repo_dir
        staging = staging or cache / STAGING_NAME
        target = paths.snapshot(entry.commit)
    finals = {f.path: into / f.path if into is not None else paths.blob(f.blob_id)
              for f in entry.files}
    _check_space(entry, staging, finals, dest_root)
    try:
        dest_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheLayoutError(f"cannot create {dest_root}: {exc.strerror or exc}") from exc
    result = PullResult(repo_id=entry.repo_id, commit=entry.commit, target=target)
    for locked in entry.files:
        if into is not None:
            final = _inside(into, into / locked.path)
            if final.is_symlink() or final.is_dir():
                raise CacheLayoutError(f"{final} exists and is not a regular file")
        else:
            final = paths.blob(locked.blob_id)
        if _reusable(final, locked):
            check_format(final, f"{entry.repo_id}:{locked.path}", policy)
            if cache is not None:
                link_snapshot_file(paths, entry.commit, locked)
            result.reused.append(locked.path)
            if progress is not None:
                progress(locked.size)
            if on_file is not None:
                on_file(locked, "reused")
            continue
        blob = hub.fetch(entry.repo_id, locked.path, entry.commit,
                         staging_part(staging, entry, locked), locked.size, progress)
        _verify_staged(blob, locked)
        try:
            check_format(blob, f"{entry.repo_id}:{locked.path}", policy)
        except BaseException:
            blob.unlink(missing_ok=True)
            raise
        try:
            if into is not None:
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(blob, final)
            else:
                install_blob(paths, locked, blob, move=True, verify=False)
                link_snapshot_file(paths, entry.commit, locked)
        except OSError as exc:
            raise CacheLayoutError(f"cannot move {locked.path} into place: {exc}") from exc
        result.downloaded.append(locked.path)
        result.bytes_downloaded += locked.size
        if on_file is not None:
            on_file(locked, "downloaded")
    if cache is not None:
        paths.snapshot(entry.commit).mkdir(parents=True, exist_ok=True)
        write_ref(paths, entry.requested_revision, entry.commit)
    shutil.rmtree(staging, ignore_errors=True)
    return result


def select_entries(lock: Lockfile, repo_ids: Sequence[str]) -> list[LockEntry]:
    """Return the entries named by ``repo_ids`` (all entries if empty).

    Raises:
        EntryNotInLockError: A named repository is not pinned.
    """
    if not repo_ids:
        return list(lock.entries)
    return [lock.entry(r) for r in repo_ids]


def plain_dir_for(into: Path, entry: LockEntry, several: bool) -> Path:
    """Destination of one model under ``--into``: DIR itself, or ``DIR/<org>/<name>`` when the
    pull covers several models."""
    return into / entry.repo_id if several else into
