"""Download exactly the pinned bytes and make them visible only once verified.

Each file is fetched by commit SHA (never a branch) into a private staging cache next to the
destination (same filesystem, so the final step is a rename), hashed, compared with the lock
and only then renamed into place. The model becomes visible only complete:

* ``--into DIR``: ``DIR/<path>`` (plain directory, loadable by path). A new (or empty) DIR is
  built as ``.DIR.weights-staging/tree`` and renamed to DIR once every file is verified; an
  existing non-empty DIR is completed in place, one atomic file at a time.
* ``--cache DIR``: the Hugging Face cache layout (``blobs/``, ``snapshots/<commit>/``,
  ``refs/<revision>``), loadable by repo id with ``HF_HUB_OFFLINE=1``. Verified blobs land
  one by one (nothing loads a blob without a snapshot link); ``snapshots/<commit>`` appears
  at once with every link (:func:`weights.cache.publish_snapshot`), then the ref.

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
    publish_snapshot,
    repo_folder_name,
    write_ref,
)
from weights.digests import ProgressCallback
from weights.errors import CacheLayoutError, DigestMismatchError, StorageError, WeightsError
from weights.hub import HubClient
from weights.installpaths import existing_twin
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
        resumed: Files an interrupted earlier run had left in the staging area (partial
            downloads resumed by HTTP Range, verified files not yet published).
    """

    repo_id: str
    commit: str
    target: Path
    downloaded: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    bytes_downloaded: int = 0
    resumed: int = 0


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
            Kept on failure or interruption so the next run resumes (``resumed`` counts what
            it found); removed on success.
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
    if hub.offline:  # refuse before the lock file or the staging area is created
        _offline_check(hub, entry, into, cache)
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


def _offline_check(hub: HubClient, entry: LockEntry, into: Path | None,
                   cache: Path | None) -> None:
    """In offline mode, refuse a pull that would download anything (a file not in place and
    verified), before anything is written.

    Raises:
        HubOfflineError: A file would have to be downloaded.
    """
    if into is not None:
        finals = {f.path: into / f.path for f in entry.files}
    else:
        assert cache is not None
        paths = hf_cache_paths(cache, entry.repo_id)
        finals = {f.path: paths.blob(f.blob_id) for f in entry.files}
    absent = [f.path for f in entry.files if not _reusable(finals[f.path], f)]
    if absent:
        hub.require_online(f"{entry.repo_id}@{entry.commit[:12]}: {len(absent)} file(s) to "
                           f"download ({absent[0]}{', ...' if len(absent) > 1 else ''})")


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


def _leftovers(staging: Path, entry: LockEntry, tree: Path | None) -> int:
    """Files an interrupted earlier run left in ``staging`` for this entry (partial downloads,
    verified files not yet published); they are resumed, not fetched again."""
    found = 0
    part_dir = staging / repo_folder_name(entry.repo_id)
    if part_dir.is_dir():
        found += sum(1 for p in part_dir.iterdir() if p.name.endswith(".part"))
    if tree is not None and tree.is_dir():
        found += sum(1 for p in tree.rglob("*") if p.is_file())
    return found


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
    tree: Path | None = None  # where a new --into directory is built until complete
    if into is not None:
        staging = staging or into.parent / f".{into.name}{STAGING_NAME}"
        fresh = not os.path.lexists(into) or (into.is_dir() and not any(into.iterdir()))
        # A new (or empty) --into directory appears only complete: built in staging, then
        # renamed. An existing one is completed in place, file by file.
        tree = staging / "tree" if fresh else None
        dest_root = tree or into
        target = into
    else:
        assert cache is not None
        paths = hf_cache_paths(cache, entry.repo_id)
        twin = existing_twin(cache, paths.repo_dir.name)
        if twin is not None:  # one repository on the Hub and on a case-folding disk
            raise CacheLayoutError(
                f"{entry.repo_id} would install to {paths.repo_dir}, but the cache holds "
                f"{twin}, the same name when case and Unicode normalisation are ignored",
                hint="pull with the repo id spelled as installed, or remove the other copy")
        dest_root = paths.repo_dir
        staging = staging or cache / STAGING_NAME
        target = paths.snapshot(entry.commit)
    result = PullResult(repo_id=entry.repo_id, commit=entry.commit, target=target,
                        resumed=_leftovers(staging, entry, tree))
    if result.resumed:
        _log.info("%s: resuming %d file(s) left in %s by an interrupted run",
                     entry.repo_id, result.resumed, staging)
    finals = {f.path: dest_root / f.path if into is not None else paths.blob(f.blob_id)
              for f in entry.files}
    _check_space(entry, staging, finals, target if into is not None else dest_root)
    try:
        dest_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheLayoutError(f"cannot create {dest_root}: {exc.strerror or exc}") from exc
    for locked in entry.files:
        if into is not None:
            final = _inside(dest_root, dest_root / locked.path)
            if final.is_symlink() or final.is_dir():
                raise CacheLayoutError(f"{final} exists and is not a regular file")
        else:
            final = paths.blob(locked.blob_id)
        if _reusable(final, locked):
            check_format(final, f"{entry.repo_id}:{locked.path}", policy)
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
        except OSError as exc:
            raise CacheLayoutError(f"cannot move {locked.path} into place: {exc}") from exc
        result.downloaded.append(locked.path)
        result.bytes_downloaded += locked.size
        if on_file is not None:
            on_file(locked, "downloaded")
    # Complete and verified: only now does the model become visible (one rename).
    if tree is not None:
        assert into is not None
        try:
            into.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tree, into)  # replaces an empty directory too
        except OSError as exc:
            raise CacheLayoutError(f"cannot move {tree} to {into}: {exc.strerror or exc}") \
                from exc
    if cache is not None:
        publish_snapshot(paths, entry, staging)
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
