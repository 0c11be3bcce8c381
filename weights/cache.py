"""The Hugging Face cache layout, written and read without huggingface_hub.

Layout (``$HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``), as huggingface_hub's
``file_download.py`` writes it and vLLM reads it with ``HF_HUB_OFFLINE=1``::

    models--{org}--{name}/
        blobs/<blob_id>                  sha256 for LFS files, git blob SHA-1 otherwise
        snapshots/<commit>/<path>        relative symlink -> ../../blobs/<blob_id>
        refs/<revision>                  the commit SHA, no trailing newline

Every write is atomic: blobs and refs are written to a temporary name and renamed, symlinks
are created under a temporary name and renamed over the final one. A snapshot directory
appears only complete (:func:`publish_snapshot`: built beside, then renamed into place), so a
model loaded by commit never finds files missing; blobs (invisible until linked) may land one by
one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from weights.digests import ProgressCallback, digest_file, sha256_file
from weights.errors import CacheLayoutError, DigestMismatchError
from weights.lockfile import LockedFile, LockEntry, check_repo_path, is_commit_sha, umask_mode


def repo_folder_name(repo_id: str, repo_type: str = "model") -> str:
    """Return the cache folder name of a repository (``models--org--name``)."""
    return "--".join([f"{repo_type}s", *repo_id.split("/")])


@dataclass(frozen=True)
class HfCachePaths:
    """Paths of one repository inside a Hugging Face cache.

    Attributes:
        root: The cache root (``HF_HUB_CACHE``).
        repo_dir: ``root/models--{org}--{name}``.
        blobs: ``repo_dir/blobs``.
        snapshots: ``repo_dir/snapshots``.
        refs: ``repo_dir/refs``.
    """

    root: Path
    repo_dir: Path
    blobs: Path
    snapshots: Path
    refs: Path

    def blob(self, blob_id: str) -> Path:
        """Return the path of blob ``blob_id``."""
        return self.blobs / blob_id

    def snapshot(self, commit: str) -> Path:
        """Return the snapshot directory of ``commit``."""
        return self.snapshots / commit

    def ref(self, revision: str) -> Path:
        """Return the ref file of a branch or tag (``refs/pr/1`` style names nest)."""
        check_repo_path(revision)
        return self.refs / revision

    def read_ref(self, revision: str) -> str | None:
        """Return the commit a ref points to, or None if the ref does not exist."""
        try:
            return self.ref(revision).read_text(encoding="ascii").strip()
        except (FileNotFoundError, ValueError):
            return None


def hf_cache_paths(cache_root: str | os.PathLike[str], repo_id: str) -> HfCachePaths:
    """Return the cache paths of ``repo_id`` under ``cache_root`` (nothing is created)."""
    root = Path(cache_root)
    repo_dir = root / repo_folder_name(repo_id)
    return HfCachePaths(
        root=root,
        repo_dir=repo_dir,
        blobs=repo_dir / "blobs",
        snapshots=repo_dir / "snapshots",
        refs=repo_dir / "refs",
    )


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        umask_mode(fd)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_symlink(target: str, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and os.readlink(link) == target:
        return
    tmp = link.parent / f".{link.name}.{uuid.uuid4().hex}.tmp"
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_ref(paths: HfCachePaths, revision: str, commit: str) -> None:
    """Point ``refs/<revision>`` at ``commit`` (no trailing newline, as huggingface_hub does).

    Nothing is written when ``revision`` is the commit SHA itself (huggingface_hub writes no
    ref for a SHA either).
    """
    if revision == commit or is_commit_sha(revision):
        return
    _atomic_write_text(paths.ref(revision), commit)


def link_snapshot_file(paths: HfCachePaths, commit: str, locked: LockedFile) -> Path:
    """Create ``snapshots/<commit>/<path>`` as a relative symlink to its blob; return the link."""
    link = paths.snapshot(commit) / check_repo_path(locked.path)
    target = os.path.relpath(paths.blob(locked.blob_id), link.parent)
    _atomic_symlink(target, link)
    return link


def _snapshot_complete(paths: HfCachePaths, commit: str, files: Sequence[LockedFile]) -> bool:
    snap = paths.snapshot(commit)
    for locked in files:
        link = snap / locked.path
        want = os.path.relpath(paths.blob(locked.blob_id), link.parent)
        if not link.is_symlink() or os.readlink(link) != want or not link.is_file():
            return False
    return True


def publish_snapshot(paths: HfCachePaths, entry: LockEntry, staging: Path) -> Path:
    """Make ``snapshots/<commit>`` hold every file of ``entry`` at once; return it.

    The links are built in a directory under ``staging`` (same file system) and renamed into
    place; links of other files already in an existing snapshot (another include set of the same
    commit) are kept. A complete snapshot is left untouched. Every blob must be installed.

    Raises:
        CacheLayoutError: A blob is missing, or the snapshot cannot be written.
    """
    final = paths.snapshot(entry.commit)
    missing = [f.path for f in entry.files if not paths.blob(f.blob_id).is_file()]
    if missing:
        raise CacheLayoutError(f"{entry.repo_id}: blob of {missing[0]} is not installed")
    if _snapshot_complete(paths, entry.commit, entry.files):
        return final
    build: Path | None = None
    try:
        staging.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(prefix=f"snapshot-{entry.commit[:12]}-", dir=staging))
        ours = {f.path for f in entry.files}
        links: dict[str, str] = {}
        if final.is_dir() and not final.is_symlink():  # keep the other files' links
            for p in final.rglob("*"):
                rel = p.relative_to(final).as_posix()
                if p.is_symlink() and rel not in ours:
                    links[rel] = os.readlink(p)
        for locked in entry.files:
            link = final / check_repo_path(locked.path)
            links[locked.path] = os.path.relpath(paths.blob(locked.blob_id), link.parent)
        for rel, target in links.items():
            (build / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, build / rel)  # relative to the final place: valid once moved
        final.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(final):  # an incomplete snapshot (older tool, hand-made): replace
            os.rename(final, build.with_name(build.name + ".old"))
        os.rename(build, final)
        _fsync_dir(final.parent)
    except OSError as exc:
        raise CacheLayoutError(f"cannot publish {final}: {exc.strerror or exc}") from exc
    finally:
        if build is not None:
            for leftover in (build, build.with_name(build.name + ".old")):
                shutil.rmtree(leftover, ignore_errors=True)
    return final


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install_blob(
    paths: HfCachePaths,
    locked: LockedFile,
    source: Path,
    *,
    move: bool = False,
    verify: bool = True,
    progress: ProgressCallback | None = None,
) -> Path:
    """Put ``source`` into ``blobs/<blob_id>`` atomically; return the blob path.

    Args:
        paths: Cache paths of the repository.
        locked: The pinned file ``source`` holds.
        source: File with the content.
        move: Rename ``source`` instead of copying it (same filesystem only; falls back to copy).
        verify: Hash ``source`` and compare with the lock first. Pass False only when these
            exact bytes were verified already.
        progress: Byte-count callback while hashing.

    Raises:
        DigestMismatchError: ``source`` does not match the lock (nothing is installed).
        CacheLayoutError: The blob cannot be written.
    """
    if verify:
        size = source.stat().st_size
        if size != locked.size:
            raise DigestMismatchError(locked.path, f"size:{locked.size}", f"size:{size}")
        if locked.git_sha1 is None:
            sha256, git_sha1 = sha256_file(source, progress), None
        else:
            d = digest_file(source, progress)
            sha256, git_sha1 = d.sha256, d.git_sha1
        if sha256 != locked.sha256:
            raise DigestMismatchError(locked.path, f"sha256:{locked.sha256}", f"sha256:{sha256}")
        if locked.git_sha1 is not None and git_sha1 != locked.git_sha1:
            raise DigestMismatchError(
                locked.path, f"git-sha1:{locked.git_sha1}", f"git-sha1:{git_sha1}"
            )
    blob = paths.blob(locked.blob_id)
    try:
        paths.blobs.mkdir(parents=True, exist_ok=True)
        if blob.is_file() and blob.stat().st_size == locked.size and not verify:
            return blob
        tmp = paths.blobs / f"{locked.blob_id}.{uuid.uuid4().hex}.incomplete"
        if move:
            try:
                os.replace(source, tmp)
            except OSError:
                shutil.copyfile(source, tmp)
        else:
            shutil.copyfile(source, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, blob)
    except OSError as exc:
        raise CacheLayoutError(f"cannot write blob {blob}: {exc.strerror or exc}") from exc
    return blob


def install_hf_cache(
    cache_root: str | os.PathLike[str],
    entry: LockEntry,
    files: Mapping[str, Path],
    *,
    revision: str | None = None,
    move: bool = False,
    verify: bool = True,
    progress: ProgressCallback | None = None,
) -> Path:
    """Install the files of a pinned entry into a Hugging Face cache; return the snapshot dir.

    Writes ``blobs/<blob_id>``, ``snapshots/<commit>/<path>`` relative symlinks and
    ``refs/<revision>`` so that ``huggingface_hub`` and vLLM find the model offline by repo id
    and revision.

    Args:
        cache_root: Cache root directory (``HF_HUB_CACHE``); created if absent.
        entry: The lock entry; gives repo id, commit and each file's blob id.
        files: Map from repository path to a local file holding its content. Every file of
            the entry must be present.
        revision: Ref to write (default: ``entry.requested_revision``; no ref for a SHA).
        move: Rename the source files into ``blobs/`` instead of copying them.
        verify: Hash each source against the lock before installing it (see
            :func:`install_blob`).
        progress: Byte-count callback while hashing.

    Raises:
        CacheLayoutError: A file of the entry is missing from ``files`` or cannot be written.
        DigestMismatchError: A source does not match the lock; files installed before it stay
            (they are verified blobs), the ref is not written.
    """
    paths = hf_cache_paths(cache_root, entry.repo_id)
    missing = [f.path for f in entry.files if f.path not in files]
    if missing:
        raise CacheLayoutError(f"{entry.repo_id}: no source for {', '.join(missing[:5])}")
    for locked in entry.files:
        install_blob(
            paths, locked, Path(files[locked.path]), move=move, verify=verify, progress=progress
        )
    staging = paths.root / ".weights-staging"
    publish_snapshot(paths, entry, staging)
    with contextlib.suppress(OSError):
        staging.rmdir()  # only if empty: a concurrent pull may be using it
    write_ref(paths, revision or entry.requested_revision, entry.commit)
    return paths.snapshot(entry.commit)


def cache_repo_dir(path: str | os.PathLike[str], entry: LockEntry) -> Path | None:
    """Return the cache repository directory (``models--org--name``) of ``entry`` that
    ``path`` names, or None when ``path`` is not inside a Hugging Face cache of that model.

    ``path`` may be the cache root, the repo directory or one of its snapshot directories:
    for all three a loader that resolves ``entry.repo_id`` by its refs reads this repo
    directory, so a verification of ``path`` must look at its refs too.
    """
    p = Path(path)

    def is_repo(d: Path) -> bool:
        return (d / "snapshots").is_dir() and (d / "blobs").is_dir()

    if is_repo(p):
        return p
    if (p / repo_folder_name(entry.repo_id)).is_dir():
        return p / repo_folder_name(entry.repo_id)
    if p.parent.name == "snapshots" and is_repo(p.parent.parent):
        return p.parent.parent
    return None


def read_refs(repo_dir: Path) -> dict[str, str]:
    """Every ref of a cache repo directory: ref name (``main``, ``pr/1``) -> the file's text,
    exactly as a loader reads it (huggingface_hub joins ``snapshots/`` with that text as is).

    Raises:
        CacheLayoutError: A ref file cannot be read.
    """
    refs: dict[str, str] = {}
    top = repo_dir / "refs"
    for dirpath, _dirs, names in os.walk(top):  # symlinked folders are not followed
        for n in names:
            f = Path(dirpath) / n
            rel = f.relative_to(top).as_posix()
            try:
                refs[rel] = f.read_bytes().decode("ascii", "backslashreplace")
            except OSError as exc:
                raise CacheLayoutError(f"cannot read ref {f}: {exc.strerror or exc}") from exc
    return dict(sorted(refs.items()))


def resolve_model_dir(path: str | os.PathLike[str], entry: LockEntry | None) -> Path:
    """Return the directory holding the model files for ``path``.

    ``path`` may be a plain directory, a snapshot directory, a cache repo directory
    (``models--org--name``) or a cache root; for the last two the snapshot of
    ``entry.commit`` is returned.

    Raises:
        CacheLayoutError: ``path`` is not a directory, or the cache has no snapshot of the
            pinned commit.
    """
    p = Path(path)
    if not p.is_dir():
        raise CacheLayoutError(f"{p} is not a directory")
    repo_dir: Path | None = None
    if (p / "snapshots").is_dir() and (p / "blobs").is_dir():
        repo_dir = p
    elif entry is not None and (p / repo_folder_name(entry.repo_id)).is_dir():
        repo_dir = p / repo_folder_name(entry.repo_id)
    if repo_dir is None:
        return p
    if entry is None:
        raise CacheLayoutError(f"{p} is a cache; a lock entry is needed to pick the snapshot")
    snap = repo_dir / "snapshots" / entry.commit
    if not snap.is_dir():
        have = (
            sorted(s.name for s in (repo_dir / "snapshots").iterdir())
            if (repo_dir / "snapshots").is_dir()
            else []
        )
        raise CacheLayoutError(
            f"{repo_dir} has no snapshot of pinned commit {entry.commit}"
            + (f" (has {', '.join(have)})" if have else ""),
            hint="run `weights pull --cache` to fetch the pinned commit",
        )
    return snap
